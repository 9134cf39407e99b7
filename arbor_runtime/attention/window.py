"""Sliding windows on a tree: which keys a query sees, by the keys' original positions.

A layer with window ``w`` lets a query at position ``p`` see the keys at positions ``p - w < k <= p``
(transformers' ``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``). Positions are the
tokens' original ones: a retained token keeps its position after eviction, so the window is a mask
on positions, never on where a key lies in the pool or how many keys precede it.

Most context pieces are either wholly inside every query's window or wholly outside it; only those
the window's edge cuts through need a mask (:func:`visibility`).
"""

from __future__ import annotations

import torch

#: a piece's visibility to a set of queries: True = every query sees every key, False = none sees
#: any, else the (M, N) bool mask (True = seen)
Visibility = bool | torch.Tensor


def visibility(qpos: torch.Tensor, kpos: torch.Tensor, window: int) -> Visibility:
    """How queries at ``qpos`` (M,) see context keys at ``kpos`` (N,) (all earlier than every query).

    Both are long CPU tensors of original positions. Returns True, False or the (M, N) mask.
    """
    if kpos.numel() == 0:
        return False
    if int(qpos.max()) - int(kpos.min()) < window:
        return True
    if int(qpos.min()) - int(kpos.max()) >= window:
        return False
    return (qpos.unsqueeze(1) - kpos.unsqueeze(0)) < window


def own_window_mask(positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """Mask of a prefill's new tokens over themselves: causal, and within the window when there is one.

    positions: (R, q) long original positions of each row's new tokens (in order). Returns (R, 1, q, q)
    bool, True where new token i of a row sees new token j of the same row.
    """
    q = positions.shape[1]
    causal = torch.ones(q, q, dtype=torch.bool).tril()
    if window is None:
        return causal.expand(positions.shape[0], 1, q, q)
    dist = positions.unsqueeze(2) - positions.unsqueeze(1)  # (R, q, q): p_i - p_j
    return (causal & (dist < window)).unsqueeze(1)


def decode_own_mask(valid: torch.Tensor, window: int | None) -> torch.Tensor:
    """Which of each row's own generated tokens its decode query sees.

    valid: (R, n) bool, the first ``valid[r].sum()`` slots hold row r's tokens, the last of them the
    one fed now (the query): they sit at consecutive positions, so token i is ``count - 1 - i`` before
    the query. Returns (R, n) bool.
    """
    if window is None:
        return valid
    count = valid.sum(dim=1, keepdim=True)  # (R, 1)
    before = count - 1 - torch.arange(valid.shape[1], device=valid.device).unsqueeze(0)
    return valid & (before < window)
