"""Random eviction: the sinks and a recent window stay, the rest are kept uniformly at random; tree-blind.

The baseline every scorer must beat: a 2026 study (arXiv 2609.03430) finds uniform random eviction
matches the strongest heuristic evictors on reasoning. With ``granularity=token`` (the default) a
token is kept or evicted in every layer and KV head together, one draw per token; with
``granularity=head`` each layer and KV head draws its own tokens (as the study's per-head eviction
does), the same count in each. Each plan draws from a generator seeded by ``seed`` and the pool it
plans over (its blocks and sizes), so a run is reproducible whatever ran before it in the process.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from arbor_runtime.policies.base import MemoryView
from arbor_runtime.policies.scorer import FlatPool, ScorerPolicy


@dataclass(slots=True)
class RandomPolicy(ScorerPolicy):
    """Keep the first ``sink_tokens`` of the pool, the newest ``recent_ratio`` of what a plan keeps,
    and a uniform random choice of the rest (seeded); evicted tokens are dropped."""

    name = "random"
    sink_tokens: int = 4
    recent_ratio: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        ScorerPolicy.__post_init__(self)
        if isinstance(self.sink_tokens, bool) or not isinstance(self.sink_tokens, int) or self.sink_tokens < 0:
            raise ValueError(f"random sink_tokens={self.sink_tokens!r} must be a number of tokens >= 0")
        ratio = self.recent_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0.0 <= ratio <= 1.0:
            raise ValueError(f"random recent_ratio={ratio!r} must be a number in [0, 1]")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"random seed={self.seed!r} must be an integer")

    def sinks(self, cap: int) -> int:
        return self.sink_tokens

    def recent_window(self, cap: int) -> int:
        return int(cap * self.recent_ratio)

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        """(N,) uniform random scores, from a generator seeded by ``seed`` and the pool's shape."""
        return torch.rand(pool.size, generator=self._generator(view))

    def head_scores(self, view: MemoryView, block: int, held: torch.Tensor, must: torch.Tensor) -> torch.Tensor:
        """(L, H_kv, K) uniform random scores, one draw per layer, KV head and token (seeded by
        ``seed``, the pool's shape and the block)."""
        return torch.rand(held.shape, generator=self._generator(view, block))

    def _generator(self, view: MemoryView, *salt: int) -> torch.Generator:
        shape = [(b.node.id, b.kv.length, b.kv.kept_tokens) for b in view.blocks]
        digest = hashlib.blake2b(repr((self.seed, shape, *salt)).encode(), digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
