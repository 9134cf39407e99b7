"""Model backend: batched forward passes over gathered per-row KV contexts.

The backend knows nothing about trees. A :class:`BatchCache` holds, for B rows, each row's
context KV (right-padded to a common length) followed by room for new tokens; the model writes
new K/V into it in place through the ``cache.update`` call every transformers attention layer
makes. Masks are built here as explicit 4D boolean masks, because transformers derives causal
masks from *physical* cache lengths, while our rows have padding and evicted tokens; positions
always come from explicit ``position_ids`` (RoPE is applied to cached keys already).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from arbor_runtime.attention import AttentionRecorder, recording
from arbor_runtime.kv.store import KVShape


class BatchCache:
    """Working KV for one batched generation or prefill.

    Layout: ``keys[l, b, h, s, d]`` for s in [0, ctx_len) is row b's context (valid where
    ``valid[b, s]``), then new tokens at [ctx_len, ctx_len + steps). Duck-types the one method of
    transformers' ``Cache`` that attention layers call (``update``).
    """

    def __init__(self, shape: KVShape, contexts: Sequence[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> None:
        """contexts: per row (keys, values), each (L, H_kv, T_r, D). capacity: new tokens to make room for."""
        self.rows = len(contexts)
        self.ctx_len = max(int(k.shape[2]) for k, _ in contexts)
        total = self.ctx_len + capacity
        size = (shape.layers, self.rows, shape.kv_heads, total, shape.head_dim)
        self.keys = torch.zeros(size, dtype=shape.dtype, device=shape.device)
        self.values = torch.zeros(size, dtype=shape.dtype, device=shape.device)
        self.valid = torch.zeros(self.rows, total, dtype=torch.bool, device=shape.device)
        for row, (k, v) in enumerate(contexts):
            t = int(k.shape[2])
            self.keys[:, row, :, :t] = k
            self.values[:, row, :, :t] = v
            self.valid[row, :t] = True
        self.length = self.ctx_len  # physical tokens written (context + new)

    # transformers calls this once per layer per forward
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write (B, H_kv, q, D) new K/V at the end; return (B, H_kv, length + q, D) views."""
        q = key_states.shape[2]
        end = self.length + q
        if end > self.keys.shape[3]:
            raise RuntimeError(f"BatchCache overflow: {end} > capacity {self.keys.shape[3]}")
        self.keys[layer_idx, :, :, self.length : end] = key_states
        self.values[layer_idx, :, :, self.length : end] = value_states
        return self.keys[layer_idx, :, :, :end], self.values[layer_idx, :, :, :end]

    def step_mask(self, q: int) -> torch.Tensor:
        """(B, 1, q, length + q) bool: valid context and earlier new tokens, causal among the q new ones."""
        past = self.valid[:, : self.length].unsqueeze(1).expand(self.rows, q, self.length)
        causal = torch.ones(q, q, dtype=torch.bool, device=self.valid.device).tril()
        causal = causal.unsqueeze(0).expand(self.rows, q, q)
        return torch.cat([past, causal], dim=-1).unsqueeze(1)

    def advance(self, q: int) -> None:
        """Mark the q tokens written by the last forward as part of the cache."""
        self.valid[:, self.length : self.length + q] = True
        self.length += q

    def extract(self, row: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy out row's new tokens [start, start + count) (relative to ctx_len) as (L, H_kv, count, D)."""
        s = self.ctx_len + start
        return self.keys[:, row, :, s : s + count].clone(), self.values[:, row, :, s : s + count].clone()

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class ModelBackend:
    """Runs the model on a :class:`BatchCache`; counts forward calls and model time."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.shape = KVShape.of(model)
        self.forward_calls = 0
        self.model_seconds = 0.0

    @property
    def device(self) -> torch.device:
        return self.shape.device

    def new_cache(self, contexts: Sequence[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> BatchCache:
        return BatchCache(self.shape, contexts, capacity)

    @torch.inference_mode()
    def forward(
        self,
        cache: BatchCache,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: int = 1,
        recorder: AttentionRecorder | None = None,
    ) -> torch.Tensor:
        """One forward over q new tokens per row.

        Args:
            input_ids: (B, q) long; position_ids: (B, q) long true positions.
            logits_to_keep: last positions to compute logits for (0 = all).
            recorder: when given, attention mass per key slot is added to it (see attention.py).
        Returns:
            (B, k, V) float logits, k = q when logits_to_keep is 0 else logits_to_keep.
        """
        q = input_ids.shape[1]
        mask = cache.step_mask(q)
        start = time.perf_counter()
        with recording(self.model, recorder):
            out = self.model(
                input_ids=input_ids.to(self.device),
                position_ids=position_ids.to(self.device),
                attention_mask=mask,
                cache=cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # honest model time; one sync per step
        self.model_seconds += time.perf_counter() - start
        self.forward_calls += 1
        cache.advance(q)
        return out.logits
