"""Chunks of a block: the units sparse decode attention reads or skips.

A block's chunks never cross the block (thought blocks are chunks: a thought of at most
``max_len`` tokens is cut only at a sentence end). Inside a long block (a prompt, a document)
chunks are cut greedily, left to right, after a sentence or line end or where the keys drift,
once a chunk has ``min_len`` tokens; a chunk never passes ``max_len``. Greedy left-to-right
cutting is prefix-stable: the chunks of a prefix are the chunks of the whole block except the
last one, which a growing block re-cuts (:meth:`arbor_runtime.sparse.tree.ChunkTree.update`).

Quest's pages are fixed-size runs of ``page`` tokens (:func:`page_starts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: text ends that close a sentence or a line
SENTENCE_ENDS = (".", "!", "?", ";", ":", "\n")


class BoundaryTable:
    """Which token ids end a sentence or a line, decoded once per id and remembered.

    ``decode`` maps one token id to its text (a tokenizer's ``decode([id])``); a tokenizer
    without text (ids only) gives no boundaries, and chunks are then cut by drift and length.
    """

    def __init__(self, decode: Callable[[list[int]], str] | None) -> None:
        self.decode = decode
        self._ends: dict[int, bool] = {}

    def ends(self, token_ids: Sequence[int]) -> torch.Tensor:
        """(T,) bool: token t closes a sentence or a line."""
        if self.decode is None:
            return torch.zeros(len(token_ids), dtype=torch.bool)
        for tok in set(token_ids) - self._ends.keys():
            text = self.decode([tok]).rstrip(" ")
            self._ends[tok] = text.endswith(SENTENCE_ENDS) or "\n" in text
        return torch.tensor([self._ends[t] for t in token_ids], dtype=torch.bool)


def key_drift(keys: torch.Tensor, window: int = 4) -> torch.Tensor:
    """How far each token's key is from the keys just before it.

    Args:
        keys: (H, T, D) one layer's keys of a block.
        window: tokens before ``t`` whose mean direction ``t`` is compared with.
    Returns:
        (T,) float32 in [0, 2]: 1 - cosine(key_t, mean of the ``window`` normalized keys before t),
        averaged over heads; 0 for the first token.
    """
    unit = torch.nn.functional.normalize(keys.float(), dim=-1)  # (H, T, D)
    csum = torch.cat([torch.zeros_like(unit[:, :1]), unit.cumsum(1)], dim=1)  # (H, T+1, D)
    t = torch.arange(unit.shape[1])
    lo = (t - window).clamp(min=0)
    before = csum[:, t] - csum[:, lo]  # (H, T, D): sum of the keys in [t - window, t)
    cos = torch.nn.functional.cosine_similarity(unit, before, dim=-1)  # 0 where nothing is before
    drift = (1.0 - cos).mean(0)
    drift[0] = 0.0
    return drift


def chunk_starts(
    ends: torch.Tensor,
    min_len: int,
    max_len: int,
    drift: torch.Tensor | None = None,
    drift_threshold: float = float("inf"),
    start: int = 0,
) -> torch.Tensor:
    """Greedy boundary-aware chunks of tokens ``[start, T)``.

    Args:
        ends: (T,) bool, token t closes a sentence or line (a cut may follow it).
        min_len / max_len: chunk length bounds (the last chunk may be shorter than ``min_len``).
        drift: (T,) float, key drift at each token (a cut may come before a token whose drift
            passes ``drift_threshold``); None: no drift cuts.
        start: first token to chunk (earlier tokens are already chunked).
    Returns:
        (C + 1,) long chunk boundaries: chunk c is tokens ``[out[c], out[c + 1])``; ``out[0] = start``.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"chunk lengths must satisfy 1 <= min_len <= max_len, got {min_len}, {max_len}")
    n = int(ends.numel())
    cut_after = ends.tolist()
    if drift is not None:  # a drifting token starts a chunk: a cut after the token before it
        jumps = (drift > drift_threshold).tolist()
        cut_after = [c or (i + 1 < n and jumps[i + 1]) for i, c in enumerate(cut_after)]
    out, s = [start], start
    for t in range(start, n):
        length = t + 1 - s
        if length >= max_len or (cut_after[t] and length >= min_len):
            s = t + 1
            out.append(s)
    if out[-1] != n:
        out.append(n)  # the last chunk, possibly shorter than min_len
    return torch.tensor(out, dtype=torch.long)


def page_starts(length: int, page: int, start: int = 0) -> torch.Tensor:
    """(P + 1,) boundaries of fixed pages of ``page`` tokens over ``[start, length)`` (Quest)."""
    if page < 1:
        raise ValueError(f"page={page} must be a positive number of tokens")
    bounds = list(range(start, length, page)) + [length]
    return torch.tensor(bounds if length > start else [start], dtype=torch.long)
