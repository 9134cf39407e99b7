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

The names importable from the former module ``arbor_runtime.attention`` stay importable here;
the batch (tree.py) is imported from its module or from ``arbor_runtime.backend``.
"""

from arbor_runtime.attention.hook import _ACTIVE, IMPLEMENTATION, _tree_attention, tree_attention
from arbor_runtime.attention.kernels import (
    KEY_CHUNK,
    QUERY_CHUNK,
    CudaKernels,
    Kernel,
    KernelFn,
    _cpu_flash,
    _cuda_efficient,
    _cuda_torch_flash,
    _fast_kernel,
    _flash_attn_func,
    attention_mass,
    attention_reference,
    cuda_kernel_for,
    flash_attn_kernel,
)
from arbor_runtime.attention.merge import merge_partials

__all__ = [
    "IMPLEMENTATION",
    "KEY_CHUNK",
    "QUERY_CHUNK",
    "CudaKernels",
    "Kernel",
    "KernelFn",
    "_ACTIVE",
    "_cpu_flash",
    "_cuda_efficient",
    "_cuda_torch_flash",
    "_fast_kernel",
    "_flash_attn_func",
    "_tree_attention",
    "attention_mass",
    "attention_reference",
    "cuda_kernel_for",
    "flash_attn_kernel",
    "merge_partials",
    "tree_attention",
]
