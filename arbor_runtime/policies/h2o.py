"""H2O (Zhang et al. 2023): heavy hitters by accumulated attention + a recent window; tree-blind.

All blocks are one flattened sequence in creation order; evicted tokens are dropped for good.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.allocation import flat_pool, plan_from_mask
from arbor_runtime.policies.base import Capabilities, MemoryView, Policy, RetentionPlan


@dataclass(slots=True)
class H2OPolicy(Policy):
    """Keep ``heavy_ratio : recent_ratio`` of the target as heavy hitters : most recent tokens.

    The paper's defaults (10% heavy, 10% recent of the cache) give an even split of whatever the
    budget leaves for blocks.
    """

    name = "h2o"
    CAPABILITIES = Capabilities(needs_attention=True)
    heavy_ratio: float = 0.1
    recent_ratio: float = 0.1

    def __post_init__(self) -> None:
        Policy.__post_init__(self)
        if self.heavy_ratio < 0 or self.recent_ratio < 0 or self.heavy_ratio + self.recent_ratio == 0:
            raise ValueError(
                f"h2o ratios heavy={self.heavy_ratio}, recent={self.recent_ratio} must be >= 0, not both 0"
            )

    def plan(self, view: MemoryView) -> RetentionPlan | None:
        pos, tok, att = flat_pool(view.blocks)
        cap = max(view.target, 0)
        if tok.numel() <= cap:
            return None
        n_recent = round(cap * self.recent_ratio / (self.heavy_ratio + self.recent_ratio))
        keep = torch.zeros(tok.numel(), dtype=torch.bool)
        if n_recent:
            keep[-n_recent:] = True
        n_heavy = cap - n_recent
        if n_heavy > 0:
            scores = att.clone().float().masked_fill(keep, float("-inf"))
            keep[torch.topk(scores, n_heavy).indices] = True
        return RetentionPlan(keep=plan_from_mask(view.blocks, pos, tok, keep))
