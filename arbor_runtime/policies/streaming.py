"""StreamingLLM (Xiao et al. 2023): attention sinks + the most recent tokens; tree-blind, dropped."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.base import MemoryView
from arbor_runtime.policies.scorer import FlatPool, ScorerPolicy


@dataclass(slots=True)
class StreamingPolicy(ScorerPolicy):
    """Keep the first ``sink_tokens`` of the pool and the newest tokens in creation order: a
    token's score is its place in the pool (the newer, the higher)."""

    name = "streaming"
    sink_tokens: int = 4

    def __post_init__(self) -> None:
        ScorerPolicy.__post_init__(self)
        if isinstance(self.sink_tokens, bool) or not isinstance(self.sink_tokens, int) or self.sink_tokens < 0:
            raise ValueError(f"streaming sink_tokens={self.sink_tokens!r} must be a number of tokens >= 0")

    def sinks(self, cap: int) -> int:
        return self.sink_tokens

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        return torch.arange(pool.size, dtype=torch.float32)

    def head_scores(self, view: MemoryView, block: int, held: torch.Tensor, must: torch.Tensor) -> torch.Tensor:
        """Per head the same rule: the newer the token (its block-local index), the higher."""
        return held.float()
