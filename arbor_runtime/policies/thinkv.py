"""ThinKV-style: thought-aware but linear. Budget spread over thought blocks by importance.

Blocks are taken in generation order with no tree topology: a block's importance is the mean
attention its tokens received; the budget is water-filled over blocks by importance; inside a
block the most-attended tokens stay. Evicted tokens are dropped; there is no rehydration.
"""

from __future__ import annotations

from dataclasses import dataclass

from arbor_runtime.policies.allocation import fit_floors, top_tokens, water_fill
from arbor_runtime.policies.base import Capabilities, MemoryView, Policy, RetentionPlan


@dataclass(slots=True)
class ThinKVPolicy(Policy):
    name = "thinkv"
    CAPABILITIES = Capabilities(needs_attention=True)
    #: tokens of each block kept whatever its importance (the thought's opening tokens)
    min_tokens_per_block: int = 1

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
        return plan
