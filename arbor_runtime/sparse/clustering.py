"""Balanced k-means over batches of vectors: the grouping of one index level into the next.

Tensor ops over a batch dimension (every layer and KV head at once); clusters hold at most
``cap`` members, so a level's child lists are short and evenly padded.
"""

from __future__ import annotations

import math

import torch


def balanced_kmeans(x: torch.Tensor, k: int, cap: int, iters: int = 4) -> torch.Tensor:
    """Cluster each batch's N vectors into ``k`` groups of at most ``cap`` members.

    Starts from contiguous runs of the input order (text order: neighbouring chunks are alike),
    then alternates centroid updates with capacity-constrained nearest-centroid assignment.

    Args:
        x: (B, N, D) float32.
        k, cap: clusters and members per cluster at most; ``k * cap >= N``.
    Returns:
        (B, N) long cluster of each vector.
    """
    b, n, _ = x.shape
    if k * cap < n:
        raise ValueError(f"{k} clusters of {cap} cannot hold {n} members")
    assign = (torch.arange(n) * k // n).expand(b, n).clone()
    sq = (x * x).sum(-1, keepdim=True)  # (B, N, 1)
    for _ in range(iters):
        centers = group_mean(x, assign, k)  # (B, k, D)
        dist = sq - 2 * x @ centers.transpose(1, 2) + (centers * centers).sum(-1).unsqueeze(1)  # (B, N, k)
        assign = capacity_assign(dist, cap)
    return assign


def capacity_assign(dist: torch.Tensor, cap: int) -> torch.Tensor:
    """Nearest cluster with room: rounds where each unplaced point asks its nearest non-full
    cluster and each cluster takes its closest askers up to its room.

    Args:
        dist: (B, N, k) distances; cap: members per cluster at most.
    Returns:
        (B, N) long cluster of each point.
    """
    b, n, k = dist.shape
    assign = torch.full((b, n), -1, dtype=torch.long)
    load = torch.zeros(b, k, dtype=torch.long)
    batch = torch.arange(b).unsqueeze(1).expand(b, n)
    while bool((assign < 0).any()):
        free = assign < 0
        d = dist.masked_fill((load >= cap).unsqueeze(1), float("inf"))
        near, choice = d.min(-1)  # (B, N)
        near = near.masked_fill(~free, float("inf"))
        slot = batch * k + choice  # one id per (batch, cluster)
        order = torch.argsort(near.reshape(-1), stable=True)
        order = order[torch.argsort(slot.reshape(-1)[order], stable=True)]  # by cluster, then distance
        ranked = slot.reshape(-1)[order]
        first = torch.searchsorted(ranked, ranked, right=False)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel()) - first
        room = (cap - load).reshape(-1)[slot.reshape(-1)]
        take = (free.reshape(-1) & (rank < room)).view(b, n)
        assign[take] = choice[take]
        load = load.reshape(-1).index_add(0, slot[take], torch.ones_like(slot[take])).view(b, k)
    return assign


def group_mean(x: torch.Tensor, assign: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k, D) mean of each group's members (zero for an empty group). x: (B, N, D); assign: (B, N)."""
    b, _, d = x.shape
    sums = torch.zeros(b, k, d, dtype=x.dtype).scatter_add_(1, assign.unsqueeze(-1).expand_as(x), x)
    counts = torch.zeros(b, k, dtype=x.dtype).scatter_add_(1, assign, torch.ones_like(assign, dtype=x.dtype))
    return sums / counts.clamp(min=1).unsqueeze(-1)


def member_lists(assign: torch.Tensor, k: int, width: int | None = None) -> torch.Tensor:
    """(B, k, M) ids of each group's members in increasing order, -1 padded; M = largest group
    (or ``width`` when larger). assign: (B, N)."""
    b, n = assign.shape
    order = torch.argsort(assign, dim=1, stable=True)  # members grouped by cluster, in id order
    grouped = assign.gather(1, order)
    counts = torch.zeros(b, k, dtype=torch.long).scatter_add_(1, assign, torch.ones_like(assign))
    first = counts.cumsum(1) - counts
    rank = torch.arange(n).unsqueeze(0) - first.gather(1, grouped)
    m = max(int(counts.max()) if n else 0, width or 0, 1)
    out = torch.full((b, k, m), -1, dtype=torch.long)
    out[torch.arange(b).unsqueeze(1).expand(b, n), grouped, rank] = order
    return out


def n_groups(n: int, fanout: int) -> int:
    """Groups of about ``fanout`` members for n items."""
    return max(1, math.ceil(n / fanout))
