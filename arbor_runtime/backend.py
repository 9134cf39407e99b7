"""Model backend: one forward over a :class:`TreeBatch` whose context is read in place from the pool.

The backend knows nothing about trees. A batch is R rows of q new tokens each; every row's
context is a list of *pieces* (runs of pool slots, each shared by the rows whose path holds it),
its previously generated tokens (decode), and the new tokens themselves. The model writes the new
tokens' K/V straight into their pool slots through the ``update`` call each transformers
attention layer makes (the batch duck-types that one method of ``Cache``), then the tree
attention function (arbor_runtime/attention/) attends each piece once for all its rows. Positions always come
from explicit ``position_ids`` (RoPE is already applied to cached keys); no mask is built.

:class:`~arbor_runtime.attention.tree.TreeBatch` and ``context_groups`` live in
arbor_runtime/attention/tree.py (the dense tree attention), the batch types in batch.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from arbor_runtime.attention import Kernel, tree_attention
from arbor_runtime.attention.support import ModelAttention, model_attention
from arbor_runtime.kv.shape import KVShape

if TYPE_CHECKING:
    from arbor_runtime.attention.tree import TreeBatch
    from arbor_runtime.sparse import SparseAttention

__all__ = ["ModelBackend"]


class ModelBackend:
    """Runs the model on a :class:`TreeBatch`; counts forward calls and model time.

    A model whose attention the tree attention cannot serve exactly is refused here (attention/support.py).
    """

    def __init__(self, model: torch.nn.Module, fast_kernel: bool = True) -> None:
        self.model = model
        #: what the model's attention asks for, per layer (windows, soft caps, sinks)
        self.attention: ModelAttention = model_attention(model)
        self.shape = KVShape.of(model)
        self.kernel = Kernel(self.shape.device, use_fast=fast_kernel)
        self.forward_calls = 0
        self.model_seconds = 0.0
        #: sparse decode attention (a sparse policy's); None = every step attends densely
        self.sparse: SparseAttention | None = None

    @property
    def device(self) -> torch.device:
        return self.shape.device

    @torch.inference_mode()
    def forward(
        self, batch: TreeBatch, input_ids: torch.Tensor, position_ids: torch.Tensor, logits_to_keep: int = 1
    ) -> torch.Tensor:
        """One forward over q new tokens per row.

        Args:
            input_ids: (R, q) long; position_ids: (R, q) long true positions.
            logits_to_keep: last positions to compute logits for (0 = all).
        Returns:
            (R, k, V) logits, k = q when logits_to_keep is 0 else logits_to_keep.
        """
        start = time.perf_counter()
        batch.positions = position_ids.cpu()  # a sliding window is a mask on positions (attention/window.py)
        if self.sparse is not None and batch.own_slots is not None:  # decode steps only; prefill stays dense
            batch.sparse = self.sparse.prepare(batch, position_ids[:, -1])
        with tree_attention(self.model, batch):
            out = self.model(
                input_ids=input_ids.to(self.device),
                position_ids=position_ids.to(self.device),
                cache=batch,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # honest model time; one sync per step
        self.model_seconds += time.perf_counter() - start
        self.forward_calls += 1
        return out.logits
