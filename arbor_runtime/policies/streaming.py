"""StreamingLLM (Xiao et al. 2023): attention sinks + the most recent tokens; tree-blind, dropped."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.allocation import flat_pool, plan_from_mask
from arbor_runtime.policies.base import MemoryView, Policy, RetentionPlan


@dataclass(slots=True)
class StreamingPolicy(Policy):
    """Keep the first ``sink_tokens`` of the pool and the newest tokens in creation order."""

    name = "streaming"
    sink_tokens: int = 4

    def plan(self, view: MemoryView) -> RetentionPlan | None:
        pos, tok, _ = flat_pool(view.blocks)
        cap = max(view.target, 0)
        if tok.numel() <= cap:
            return None
        keep = torch.zeros(tok.numel(), dtype=torch.bool)
        sinks = min(self.sink_tokens, cap)
        keep[:sinks] = True
        if cap - sinks > 0:
            keep[-(cap - sinks) :] = True
        return RetentionPlan(keep=plan_from_mask(view.blocks, pos, tok, keep))
