"""SnapKV (Li et al. 2024): keep what an observation window attends to, pooled; tree-blind, dropped.

The runtime records, for this policy only, the attention mass each token receives from the last
``window_size`` queries of each prefilled block (prompt, forced block, prefill chunk), summed over
layers, heads and those queries; a newer window replaces the record of every token it sees, and
decode queries are not counted (``Policy.observation_window``). A plan keeps the newest
``window_size`` tokens of the flattened pool (the window itself, and tokens decoded since), then
the tokens with the highest pooled window score: scores are smoothed along each block's token
positions with a ``kernel_size`` pooling (average or max, zero-padded, window tokens zeroed, as
SnapKV / kvpress pool the scores before the window) so neighbours of a strongly attended token
stay with it. All blocks are one flattened sequence in creation order; evicted tokens are dropped.

kvpress's SnapKVPress makes the same choice per layer and KV head: with ``granularity=head`` so does
this policy (each head's own window record, pooled the same way); with ``granularity=token`` (the
default) the score is summed over layers and heads (see docs/results.md for what that costs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from arbor_runtime.policies.base import Capabilities, MemoryView
from arbor_runtime.policies.scorer import FlatPool, ScorerPolicy

POOLINGS = ("avg", "max")


@dataclass(slots=True)
class SnapKVPolicy(ScorerPolicy):
    """Observation-window attention, pooled, plus the window itself (SnapKV defaults of kvpress: 64, 5, avg)."""

    name = "snapkv"
    window_size: int = 64
    kernel_size: int = 5
    pooling: str = "avg"

    def __post_init__(self) -> None:
        ScorerPolicy.__post_init__(self)
        if not isinstance(self.window_size, int) or self.window_size < 1:
            raise ValueError(f"snapkv window_size={self.window_size!r} must be a positive number of queries")
        if not isinstance(self.kernel_size, int) or self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"snapkv kernel_size={self.kernel_size!r} must be a positive odd number of tokens")
        if self.pooling not in POOLINGS:
            raise ValueError(f"snapkv pooling={self.pooling!r}; valid: {', '.join(POOLINGS)}")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(needs_attention=True, observation_window=self.window_size)

    def recent_window(self, cap: int) -> int:
        return self.window_size

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        """(N,) pooled window scores: :meth:`pooled` of each block."""
        return torch.cat([self.pooled(b.kv, protected[pool.block == i], b.kv.kept) for i, b in enumerate(view.blocks)])

    def pooled(self, kv, protected: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """(T_kept,) pooled window scores of a block's device tokens.

        Pooling runs over the block's token positions (evicted tokens count as 0); the protected
        (window) tokens' scores are zeroed first, so they do not lift their neighbours.
        """
        kept = kept.cpu()
        scores = torch.zeros(kv.length)
        scores[kept] = kv.attention[kept].float()
        scores[kept[protected]] = 0.0
        pad = self.kernel_size // 2
        row = scores.view(1, 1, -1)
        if self.pooling == "avg":
            pooled = F.avg_pool1d(row, self.kernel_size, stride=1, padding=pad)
        else:
            pooled = F.max_pool1d(row, self.kernel_size, stride=1, padding=pad)
        return pooled.view(-1)[kept]

    def head_scores(self, view: MemoryView, block: int, held: torch.Tensor, must: torch.Tensor) -> torch.Tensor:
        """Each layer's KV head's own window record of the tokens it holds, pooled along the block's
        positions as :meth:`pooled` does (tokens it does not hold and protected ones count as 0)."""
        kv = view.blocks[block].kv
        layers, kv_heads, k = held.shape
        scores = torch.zeros(layers * kv_heads, kv.length)
        if kv.head_attention is not None:
            flat = held.reshape(layers * kv_heads, k)
            scores.scatter_(1, flat, kv.head_attention.reshape(layers * kv_heads, -1).gather(1, flat))
        scores[:, must.cpu()] = 0.0
        pad, row = self.kernel_size // 2, scores.unsqueeze(1)
        if self.pooling == "avg":
            pooled = F.avg_pool1d(row, self.kernel_size, stride=1, padding=pad)
        else:
            pooled = F.max_pool1d(row, self.kernel_size, stride=1, padding=pad)
        return pooled.view(layers, kv_heads, -1).gather(2, held)
