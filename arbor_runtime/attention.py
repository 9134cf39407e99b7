"""Attention statistics: how much attention each cached token receives from later queries.

A thin attention function registered through transformers' attention interface runs the
regular SDPA kernel and, while a :class:`AttentionRecorder` is active, also computes the softmax
probabilities of small query groups (decode steps and short forced blocks, q <= ``max_queries``)
and adds them up per key. Cost: one extra ``Q K^T`` + softmax per layer for those steps, i.e.
O(B * H * q * S) floats, the same order as the attention itself; long prefills (the prompt)
are not observed. Outputs are those of SDPA, unchanged.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

IMPLEMENTATION = "arbor_sdpa"
_ACTIVE: contextvars.ContextVar[AttentionRecorder | None] = contextvars.ContextVar("arbor_recorder", default=None)


class AttentionRecorder:
    """Accumulates attention mass per (row, physical key slot) over layers, heads and queries.

    ``mass``: (B, S_max) float32, S_max = the batch cache's total slots.
    """

    def __init__(self, rows: int, slots: int, device: torch.device, max_queries: int = 64) -> None:
        self.mass = torch.zeros(rows, slots, dtype=torch.float32, device=device)
        self.max_queries = max_queries
        self.row_weight: torch.Tensor | None = None  # (B,) 0/1: rows whose queries count this step
        self.queries = torch.zeros(rows, dtype=torch.float32, device=device)  # (B,) queries observed per row

    def observe(self, module, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling) -> None:
        """query: (B, Hq, q, D); key: (B, Hkv, S, D); mask: (B, 1, q, S) bool or additive, or None."""
        b, hq, q, d = query.shape
        hkv, s = key.shape[1], key.shape[2]
        groups = hq // hkv
        # query heads j*groups..(j+1)*groups-1 share kv head j: group them instead of copying keys
        qg = query.float().reshape(b, hkv, groups * q, d)
        scale = scaling if scaling is not None else d**-0.5
        scores = torch.matmul(qg, key.float().transpose(-1, -2)).mul_(scale).view(b, hkv, groups, q, s)
        if mask is not None:
            m = mask.unsqueeze(2)  # (B, 1, 1, q, S)
            scores = scores.masked_fill(~m, float("-inf")) if mask.dtype == torch.bool else scores + m
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
        mass = probs.sum(dim=(1, 2, 3))  # (B, S)
        weight = self.row_weight if self.row_weight is not None else torch.ones_like(self.queries)
        self.mass[:, :s] += mass * weight.unsqueeze(1)
        if getattr(module, "layer_idx", 0) == 0:  # count each forward's queries once, not per layer
            self.queries += q * weight


def _arbor_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    out = sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    rec = _ACTIVE.get()
    if rec is not None and query.shape[2] <= rec.max_queries:
        rec.observe(module, query, key, attention_mask, kwargs.get("scaling"))
    return out


AttentionInterface.register(IMPLEMENTATION, _arbor_sdpa)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


@contextmanager
def recording(model: torch.nn.Module, recorder: AttentionRecorder | None) -> Iterator[None]:
    """Route the model's attention through the recording function while the block runs.

    With ``recorder=None`` nothing changes. The model's attention implementation is restored in
    ``finally`` whatever happens.
    """
    if recorder is None:
        yield
        return
    previous = model.config._attn_implementation
    token = _ACTIVE.set(recorder)
    model.config._attn_implementation = IMPLEMENTATION
    try:
        yield
    finally:
        model.config._attn_implementation = previous
        _ACTIVE.reset(token)
