"""Tree attention, split along its seams (each module's docstring says what it holds):

- call.py: what one layer asks through the transformers attention interface (scale, sliding window,
  soft cap, sinks), read from its keyword arguments; anything else refused;
- window.py: sliding windows as masks on the keys' original positions;
- merge.py: the exact log-sum-exp merge of attention over disjoint key sets (a leaf);
- kernels.py: attention with its log-sum-exp over one key set (CPU / CUDA / flash-attn / matmul
  fallback, chosen per device, dtype and head size) and the softmax mass per key;
- tree.py: the dense tree attention of a batch (:class:`~arbor_runtime.attention.tree.TreeBatch`):
  every row attends the blocks on its path where they lie in the pool, merged by log-sum-exp;
- hook.py: the ``arbor_tree`` transformers attention implementation that routes each layer to
  the running batch (registered at the first batch);
- support.py: which models are served (a config check and a load-time probe), refused in one line.

The package exports each module's public names; the batch (tree.py) is imported from its module.
"""

from arbor_runtime.attention.hook import IMPLEMENTATION, tree_attention
from arbor_runtime.attention.kernels import (
    KEY_CHUNK,
    QUERY_CHUNK,
    CudaKernels,
    Kernel,
    KernelFn,
    attention_mass,
    attention_reference,
    cuda_kernel_for,
    flash_attn_kernel,
    installed_flash_attn,
)
from arbor_runtime.attention.merge import merge_partials

__all__ = [
    "IMPLEMENTATION",
    "KEY_CHUNK",
    "QUERY_CHUNK",
    "CudaKernels",
    "Kernel",
    "KernelFn",
    "attention_mass",
    "attention_reference",
    "cuda_kernel_for",
    "flash_attn_kernel",
    "installed_flash_attn",
    "merge_partials",
    "tree_attention",
]
