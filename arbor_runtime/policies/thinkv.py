"""ThinKV-style: thought-aware but linear. Budget spread over thought blocks by importance.

Blocks are taken in generation order with no tree topology: a block's importance is the mean
attention its tokens received; the budget is water-filled over blocks by importance; inside a
block the most-attended tokens stay. Evicted tokens are dropped; there is no rehydration.
``granularity=head``: inside a block each layer and KV head keeps its own most-attended tokens (its own
attention record), the same count in each, as ThinKV's per-head eviction does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.allocation import fit_floors, head_top_tokens, top_tokens, water_fill
from arbor_runtime.policies.base import Capabilities, MemoryView, Policy, RetentionPlan
from arbor_runtime.policies.scorer import GRANULARITIES


@dataclass(slots=True)
class ThinKVPolicy(Policy):
    name = "thinkv"
    CAPABILITIES = Capabilities(needs_attention=True)
    #: tokens of each block kept whatever its importance (the thought's opening tokens)
    min_tokens_per_block: int = 1
    #: ``token``: a kept token keeps its K/V in every layer and KV head; ``head``: each keeps its own
    granularity: str = "token"

    def __post_init__(self) -> None:
        Policy.__post_init__(self)
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"thinkv granularity={self.granularity!r}; valid: {', '.join(GRANULARITIES)}")

    def plan(self, view: MemoryView) -> RetentionPlan | None:
        blocks = view.blocks
        sizes = [b.kv.kept_tokens for b in blocks]
        if sum(sizes) <= view.target:
            return None
        importance = [float(b.kv.attention[b.kv.kept.cpu()].mean()) if b.kv.kept_tokens else 0.0 for b in blocks]
        top = max(importance + [1e-9])
        weights = [max(i / top, 1e-3) for i in importance]
        capacity = max(view.target, 0)
        floors = fit_floors([min(self.min_tokens_per_block, s) for s in sizes], weights, capacity)
        alloc = water_fill(sizes, floors, weights, capacity)
        plan = RetentionPlan()
        for b, n, size, floor in zip(blocks, alloc, sizes, floors, strict=True):
            if n < size:
                first = b.kv.kept[:floor]
                plan.keep[b.node.id] = top_tokens(b.kv.kept, b.kv.attention, first, n)
                if self.granularity == "head":
                    held = b.kv.head_tokens(*view.kv_shape)
                    record = b.kv.head_attention
                    scores = torch.zeros(held.shape) if record is None else record.gather(2, held)
                    plan.heads[b.node.id] = head_top_tokens(held, scores, first, n)
        return plan
