"""On-demand rehydration: which evicted spans a sparse decode step would have read, most wanted first.

On demand (``on_demand``, a sparse policy's ``rehydrate=ranked``), the indexes also cover the
host-tier tokens of a block (index.py), context blocks with every token on the host join the
step unread (:func:`away_blocks`), every decode layer counts, per chunk on the host, the (row,
KV head) selections it would have entered had it been resident (:func:`count_demand`), and
after the step :func:`wanted_spans` lists those chunks' host tokens most wanted first (blocks
read whole before any, their tokens by accumulated attention, in pieces of a chunk's width),
for the memory manager to restore before the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from arbor_runtime.batch import BatchView
    from arbor_runtime.kv.store import KVStore
    from arbor_runtime.sparse.index import GroupPlan


def away_blocks(batch: BatchView, store: KVStore, on_demand: bool) -> list[tuple[int, torch.Tensor | None]]:
    """On demand: context blocks with every token on the host (no group in the batch), with the
    rows holding them (None = every row); their chunks are ranked for rehydration, not read."""
    if not on_demand or batch.context_ids is None:
        return []
    present = {g.block_id for g in batch.groups}
    holders: dict[int, list[int]] = {}
    for row, ids in enumerate(batch.context_ids):
        for block_id in ids:
            if block_id not in present and block_id in store.host:
                holders.setdefault(block_id, []).append(row)
    every = len(batch.context_ids)
    return [(b, None if len(r) == every else torch.tensor(r)) for b, r in sorted(holders.items())]


def count_demand(
    demand: torch.Tensor,
    hosted: torch.Tensor,
    token_budget: int,
    retrieved,
    scores: torch.Tensor,
    take: torch.Tensor,
    size: torch.Tensor,
) -> None:
    """Count, per hosted chunk, the (row, KV head) selections of this layer it would have entered
    if resident: its bound reaches the lowest bound taken, or the selection did not fill the budget.

    Args:
        demand / hosted: (C,) float selections counted so far (added to in place) / bool chunk
            has host-tier tokens its index covers.
        token_budget: resident context tokens read per row and KV head.
        retrieved: per indexed block, (ids (R, H, m) step chunk ids, bounds (R, H, m)).
        scores / take / size: (R, H, K) the sorted selection, what was taken, resident tokens.
    """
    finite = torch.isfinite(scores)
    lowest = torch.where(take & finite, scores, float("inf")).amin(-1, keepdim=True)  # (R, H, 1)
    filled = (size * take).sum(-1, keepdim=True) >= token_budget
    lowest = torch.where(filled, lowest, float("-inf"))
    for got, best in retrieved:
        want = hosted[got] & torch.isfinite(best) & (best >= lowest)
        if bool(want.any()):
            demand.index_add_(0, got[want], torch.ones(int(want.sum()), device=got.device))


def wanted_spans(
    store: KVStore, width: int, whole_blocks: list[int], plans: list[GroupPlan], demand: torch.Tensor | None
) -> list[tuple[int, torch.Tensor]]:
    """A step's demand for evicted spans, most wanted first: (block id, its block-local tokens on the
    host). Blocks read whole come first (all their tokens are read; the most attended first, in
    pieces of ``width``), then the chunks by how many (layer, row, KV head) selections they would
    have entered (ties: block order, then position).

    Args:
        whole_blocks: the step's context blocks read whole; plans: its indexed blocks.
        demand: (C,) the step's counted selections per step chunk id (None: none counted).
    """
    out: list[tuple[float, int, int, int, torch.Tensor]] = []
    for order, block_id in enumerate(whole_blocks):
        idx = store.host.indices(block_id) if block_id in store else None
        if idx is not None:  # no index to rank them: the most attended tokens first, in pieces
            idx = idx[torch.argsort(store.get(block_id).attention[idx], descending=True, stable=True)]
            for i in range(0, int(idx.numel()), width):
                out.append((float("inf"), order, i, block_id, idx[i : i + width].sort().values))
    demand = demand.cpu() if demand is not None else None
    for order, plan in enumerate(plans):
        idx = store.host.indices(plan.block_id) if plan.block_id in store else None
        if idx is None or demand is None:
            continue
        mine = demand[plan.offset : plan.offset + plan.index.n_chunks]
        chunk = torch.searchsorted(plan.index.starts, idx, right=True) - 1
        for c in torch.nonzero(mine > 0).squeeze(1).tolist():
            out.append((float(mine[c]), len(whole_blocks) + order, c, plan.block_id, idx[chunk == c]))
    out.sort(key=lambda w: (-w[0], w[1], w[2]))
    return [(block_id, idx) for _, _, _, block_id, idx in out if idx.numel()]
