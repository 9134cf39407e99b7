"""H2O (Zhang et al. 2023): heavy hitters by accumulated attention + a recent window; tree-blind.

All blocks are one flattened sequence in creation order; evicted tokens are dropped for good.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.base import Capabilities, MemoryView
from arbor_runtime.policies.scorer import FlatPool, ScorerPolicy


@dataclass(slots=True)
class H2OPolicy(ScorerPolicy):
    """Keep ``heavy_ratio : recent_ratio`` of the target as heavy hitters : most recent tokens.

    The paper's defaults (10% heavy, 10% recent of the cache) give an even split of whatever the
    budget leaves for blocks. A token's score is its accumulated attention.
    """

    name = "h2o"
    CAPABILITIES = Capabilities(needs_attention=True)
    heavy_ratio: float = 0.1
    recent_ratio: float = 0.1

    def __post_init__(self) -> None:
        ScorerPolicy.__post_init__(self)
        if self.heavy_ratio < 0 or self.recent_ratio < 0 or self.heavy_ratio + self.recent_ratio == 0:
            raise ValueError(
                f"h2o ratios heavy={self.heavy_ratio}, recent={self.recent_ratio} must be >= 0, not both 0"
            )

    def recent_window(self, cap: int) -> int:
        return round(cap * self.recent_ratio / (self.heavy_ratio + self.recent_ratio))

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        return pool.attention

    def head_scores(self, view: MemoryView, block: int, held: torch.Tensor, must: torch.Tensor) -> torch.Tensor:
        """Each layer's KV head's own accumulated attention of the tokens it holds."""
        record = view.blocks[block].kv.head_attention
        return torch.zeros(held.shape) if record is None else record.gather(2, held)
