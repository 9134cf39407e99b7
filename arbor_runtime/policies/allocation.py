"""Shared allocation helpers for policies: water-filling budgets and top-k token choice."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)


def finite_weights(weights: Sequence[float]) -> list[float]:
    """``weights`` with every non-finite one (nan, inf) made the lowest (the smallest finite weight,
    or 0 when that is higher): a block whose value is not a number is evicted first, never a crash.

    ``Runtime.set_value`` refuses such values, but ``node.value`` can be assigned directly.
    """
    weights = [float(w) for w in weights]
    bad = [i for i, w in enumerate(weights) if not math.isfinite(w)]
    if not bad:
        return weights
    lowest = min([w for w in weights if math.isfinite(w)] + [0.0])
    log.warning("non-finite block weights at %s (of %d) counted as the lowest, %g", bad, len(weights), lowest)
    return [w if math.isfinite(w) else lowest for w in weights]


def water_fill(sizes: Sequence[int], floors: Sequence[int], weights: Sequence[float], capacity: int) -> list[int]:
    """Tokens per block: ``min(size, floor + lam * weight * size)`` with the largest lam that fits.

    Floors are granted first (they are the protected tokens); if even the floors do not fit, the
    floors are returned and the caller sees the overrun. A non-finite weight counts as the lowest
    (:func:`finite_weights`).
    """
    weights = finite_weights(weights)
    floors = [min(f, s) for f, s in zip(floors, sizes, strict=True)]
    if sum(floors) >= capacity:
        return floors
    if sum(sizes) <= capacity:
        return list(sizes)

    def total(lam: float) -> int:
        return sum(min(s, f + int(lam * w * s)) for s, f, w in zip(sizes, floors, weights, strict=True))

    lo, hi = 0.0, 1.0
    while total(hi) < capacity and hi < 1e9:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) <= capacity else (lo, mid)
    return [min(s, f + int(lo * w * s)) for s, f, w in zip(sizes, floors, weights, strict=True)]


def fit_floors(floors: Sequence[int], weights: Sequence[float], capacity: int) -> list[int]:
    """Zero the floors of the lowest-weight blocks until the floors fit ``capacity``.

    Protected tokens (block tails, a minimum per block) are a preference, not a promise: when the
    budget cannot hold them all, the least valuable blocks lose theirs first (a non-finite weight
    is the lowest).
    """
    weights = finite_weights(weights)
    floors = list(floors)
    total = sum(floors)
    for i in sorted(range(len(floors)), key=lambda i: weights[i]):
        if total <= capacity:
            break
        total -= floors[i]
        floors[i] = 0
    return floors


def whole_blocks(sizes: Sequence[int], weights: Sequence[float], capacity: int) -> list[int]:
    """Tokens each block keeps when blocks stay whole or leave: by weight, highest first (ties: the
    earlier block), each kept whole while it fits what ``capacity`` has left, else 0."""
    weights = finite_weights(weights)
    out, left = [0] * len(sizes), capacity
    for i in sorted(range(len(sizes)), key=lambda i: -weights[i]):
        if sizes[i] <= left:
            out[i], left = sizes[i], left - sizes[i]
    return out


def top_tokens(kept: torch.Tensor, scores: torch.Tensor, must: torch.Tensor, count: int) -> torch.Tensor:
    """Choose ``count`` of the ``kept`` block-local indices: all of ``must`` first, then by score.

    Args:
        kept: (T_kept,) indices currently on device; scores: (length,) per-token scores of the block;
        must: indices that stay whatever their score (subset of kept is used).
    Returns:
        sorted (<= count,) long indices.
    """
    kept = kept.cpu()
    forced = kept[torch.isin(kept, must.cpu())]
    if forced.numel() >= count:
        return torch.sort(forced[:count]).values
    rest = kept[~torch.isin(kept, forced)]
    n_more = min(count - forced.numel(), rest.numel())
    best = rest[torch.topk(scores[rest].float(), n_more).indices] if n_more else rest[:0]
    return torch.sort(torch.cat([forced, best])).values


def head_top_tokens(held: torch.Tensor, scores: torch.Tensor, must: torch.Tensor, count: int) -> torch.Tensor:
    """Per layer and KV head, ``count`` of the tokens it holds: those in ``must`` first, then by score.

    Args:
        held: (L, H_kv, K) block-local tokens each layer and KV head holds; scores: (L, H_kv, K) float
            scores of those; must: (M,) block-local tokens that stay wherever they are held.
    Returns:
        (L, H_kv, count) long, sorted per head.
    """
    scores = scores.float().masked_fill(torch.isin(held, must.cpu()), float("inf"))
    return torch.sort(held.gather(2, torch.topk(scores, count, dim=-1).indices), dim=-1).values


def flat_pool(blocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All device tokens of the blocks in creation order, as one flattened sequence.

    Returns:
        block_pos (N,) index into ``blocks``, token (N,) block-local index, attention (N,) float.
    """
    pos, tok, att = [], [], []
    for i, b in enumerate(blocks):
        kept = b.kv.kept.cpu()
        pos.append(torch.full((kept.numel(),), i, dtype=torch.long))
        tok.append(kept)
        att.append(b.kv.attention[kept])
    if not pos:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, torch.zeros(0)
    return torch.cat(pos), torch.cat(tok), torch.cat(att)


def plan_from_mask(blocks, pos: torch.Tensor, tok: torch.Tensor, keep: torch.Tensor) -> dict[int, torch.Tensor]:
    """Turn a keep-mask over a flat pool back into per-block index sets (only changed blocks)."""
    plan = {}
    for i, b in enumerate(blocks):
        mine = pos == i
        chosen = tok[mine & keep]
        if chosen.numel() != int(mine.sum()):
            plan[b.node.id] = torch.sort(chosen).values
    return plan
