"""One thought block's KV on the device tier: which of its tokens sit in which pool slots."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from arbor_runtime.kv.pool import Extent

_layout_changes = 0
_layout_lock = threading.Lock()  # an increment lost between two threads would leave a stale number behind


def layout_epoch() -> int:
    """A number that changes whenever any block's device layout may have changed (its segments set, a
    block stored, released or split): what a reader that caches where blocks lie keys its cache on.
    One number for the process: a change in another runtime's store makes a reader work its layout
    out again, which costs time, never correctness."""
    return _layout_changes


def layout_changed() -> None:
    """Record a change of some block's device layout (see :func:`layout_epoch`); safe from any thread."""
    global _layout_changes
    with _layout_lock:
        _layout_changes += 1


@dataclass(slots=True)
class Segment:
    """Consecutive pool slots holding some of a block's tokens.

    Attributes:
        start: first pool slot.
        idx: (n,) long block-local token indices; token ``idx[i]`` is in slot ``start + i``.
    """

    start: int
    idx: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.idx.numel())

    @property
    def extent(self) -> Extent:
        return Extent(self.start, self.length)

    @property
    def slots(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.length)


@dataclass(slots=True)
class BlockKV:
    """KV record of one block: its retained tokens' pool segments and per-token statistics.

    Attributes:
        segments: where the retained tokens live (any order; attention does not care).
        start_pos: position id of the block's first token; token i has position start_pos + i.
        length: tokens in the block (retained or not; grows while a long block is prefilled in chunks).
        next_logits: (V,) float32 logits for the token after the block, on the host; children are
            sampled from them, so a block's last position is never computed twice.
        attention: (length,) float32 attention mass each token received from later queries
            (summed over layers, heads and queries; kept for evicted tokens too).
        observers: how many queries could see the block (attention / observers is the block's
            attention per query, free of the bias toward old blocks).
        head_attention: (L, H_kv, length) float32 the same attention record per layer and KV head
            (recorded only for per-head plans: ``KVStore.head_stats``); None until recorded.
        heads: None while every layer and KV head holds the same token in each slot (whole-token
            retention: slot ``j`` of the segments, in order, holds ``idx[j]`` everywhere). After a
            per-(layer, KV head) eviction (:meth:`~arbor_runtime.kv.store.KVStore.apply_heads`):
            (L, H_kv, T_kept) long, the block-local token each layer and head holds in each slot,
            slots in segment order. The block stays rectangular (``T_kept`` slots in every head), and
            ``segments``' ``idx`` then name a *nominal* token set of that size: the one a whole-token
            plan chose, which the planner counts and ``kept`` / ``positions`` report; attention reads
            the slots and needs no per-token position (keys are stored after RoPE).
    """

    segments: list[Segment]
    start_pos: int
    length: int
    next_logits: torch.Tensor | None
    attention: torch.Tensor
    observers: float = 0.0
    heads: torch.Tensor | None = None
    head_attention: torch.Tensor | None = None
    _kept: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def from_extents(cls, extents: list[Extent], start_pos: int, next_logits: torch.Tensor | None) -> BlockKV:
        """A whole block whose tokens 0..n-1 fill ``extents`` in order."""
        segments, offset = [], 0
        for ext in extents:
            segments.append(Segment(ext.start, torch.arange(offset, offset + ext.length)))
            offset += ext.length
        return cls(segments, start_pos, offset, next_logits, torch.zeros(offset))

    @property
    def kept(self) -> torch.Tensor:
        """(T_kept,) sorted block-local indices of the tokens on the device."""
        if self._kept is None:
            parts = [s.idx for s in self.segments]
            self._kept = torch.sort(torch.cat(parts)).values if parts else torch.zeros(0, dtype=torch.long)
        return self._kept

    @property
    def kept_tokens(self) -> int:
        return sum(s.length for s in self.segments)

    @property
    def whole(self) -> bool:
        return self.kept_tokens == self.length

    @property
    def positions(self) -> torch.Tensor:
        """(T_kept,) original position ids of the retained tokens."""
        return self.kept + self.start_pos

    @property
    def per_head(self) -> bool:
        """Do some layers or KV heads hold other tokens than the nominal ones (``heads`` set)?"""
        return self.heads is not None

    def head_tokens(self, layers: int, kv_heads: int) -> torch.Tensor:
        """(L, H_kv, T_kept) block-local token each layer and KV head holds in each slot, slots in
        segment order (whole-token: the segments' ``idx`` in every head)."""
        if self.heads is not None:
            return self.heads
        idx = torch.cat([s.idx for s in self.segments]) if self.segments else torch.zeros(0, dtype=torch.long)
        return idx.expand(layers, kv_heads, -1)

    def set_segments(self, segments: list[Segment]) -> None:
        self.segments = [s for s in segments if s.length]
        self._kept = None
        layout_changed()

    def slots_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """Pool slots of the given retained block-local ``tokens`` (N,), in that order."""
        if not self.segments:
            if tokens.numel():
                raise KeyError("some tokens are not on the device")
            return torch.zeros(0, dtype=torch.long)
        idx = torch.cat([s.idx for s in self.segments])
        slots = torch.cat([s.slots for s in self.segments])
        lookup = torch.full((self.length,), -1, dtype=torch.long)
        lookup[idx] = slots
        out = lookup[tokens.cpu()]
        if bool((out < 0).any()):
            raise KeyError("some tokens are not on the device")
        return out
