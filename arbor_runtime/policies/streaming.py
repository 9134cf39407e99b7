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

    def sinks(self, cap: int) -> int:
        return self.sink_tokens

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        return torch.arange(pool.size, dtype=torch.float32)
