"""Device KV pool: one preallocated tensor of token slots, handed out as ranges.

Every KV tensor the runtime keeps on the device lives here: retained block tokens and the slots
of rows being generated. With a budget the pool holds exactly ``budget_tokens`` slots, allocated
once, so device KV can never pass the budget whatever the bookkeeping says; without one it grows
(doubling, one copy) as the tree does. Ranges are handed out first-fit; a request that no single
free range can hold is split over several (a block is a list of segments), so an allocation
succeeds exactly when enough slots are free: fragmentation costs extra attention calls, never
memory. Moves inside the pool go through a staging chunk of at most ``STAGE_TOKENS`` slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: tokens moved per staging copy inside the pool (bounded scratch, independent of context)
STAGE_TOKENS = 64


@dataclass(frozen=True, slots=True)
class Extent:
    """A run of ``length`` consecutive slots starting at ``start``."""

    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


class PoolExhausted(MemoryError):
    """More slots were asked for than the pool has free (a scheduling bug: plans check first)."""


class DevicePool:
    """K/V slots for every layer: ``keys`` / ``values`` of shape (L, H_kv, S, D).

    Args:
        shape: the model's KV geometry (layers, kv heads, head dim, dtype, device).
        capacity: slots; with ``fixed`` the pool never grows past it (the budget).
        fixed: True when ``capacity`` is a hard budget; False lets the pool double when full.
    """

    def __init__(self, shape, capacity: int, fixed: bool) -> None:
        self.shape, self.fixed = shape, fixed
        self.keys = self._empty(capacity)
        self.values = self._empty(capacity)
        self._free: list[list[int]] = [[0, capacity]] if capacity else []  # sorted [start, end)
        self.used = 0
        self.peak_used = 0

    # ---- queries -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return int(self.keys.shape[2])

    @property
    def free_slots(self) -> int:
        return self.capacity - self.used

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds on the device (all slots, used or not)."""
        return 2 * self.keys.numel() * self.keys.element_size()

    def largest_free(self) -> int:
        return max((e - s for s, e in self._free), default=0)

    def free_extents(self) -> list[Extent]:
        return [Extent(s, e - s) for s, e in self._free]

    # ---- allocation ----------------------------------------------------------------------
    def alloc(self, n: int, contiguous: bool = False) -> list[Extent]:
        """``n`` slots as one extent when a free range holds them, else split over several.

        Raises :class:`PoolExhausted` when fewer than ``n`` slots are free (a fixed pool), or when
        ``contiguous`` and no single range fits.
        """
        if n <= 0:
            return []
        self._ensure(n, contiguous)
        for i, (s, e) in enumerate(self._free):
            if e - s >= n:
                return [self._take(i, n)]
        if contiguous:
            raise PoolExhausted(f"no free range of {n} slots (largest {self.largest_free()})")
        out, left = [], n
        while left:
            s, e = self._free[0]
            out.append(self._take(0, min(left, e - s)))
            left -= out[-1].length
        return out

    def extend(self, ext: Extent, n: int) -> int:
        """Grow ``ext`` in place into the free range right after it, by up to ``n`` slots; returns the slots gained."""
        for i, (s, e) in enumerate(self._free):
            if s == ext.end:
                got = min(n, e - s)
                self._take(i, got)
                return got
            if s > ext.end:
                break
        return 0

    def free(self, ext: Extent) -> None:
        """Give ``ext``'s slots back (merged with free neighbours)."""
        if ext.length <= 0:
            return
        lo, hi = ext.start, ext.end
        keep = []
        for s, e in self._free:
            if e == lo:
                lo = s
            elif s == hi:
                hi = e
            else:
                keep.append([s, e])
        keep.append([lo, hi])
        keep.sort()
        self._free = keep
        self.used -= ext.length

    # ---- data movement -------------------------------------------------------------------
    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the K/V in ``slots`` (N,): (L, H_kv, N, D) each."""
        slots = slots.to(self.keys.device)
        return self.keys.index_select(2, slots), self.values.index_select(2, slots)

    def write(self, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store (L, H_kv, N, D) K/V into ``slots`` (N,)."""
        slots = slots.to(self.keys.device)
        self.keys.index_copy_(2, slots, keys.to(self.keys.device, self.keys.dtype))
        self.values.index_copy_(2, slots, values.to(self.values.device, self.values.dtype))

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` (N,) to ``dst`` (N,), STAGE_TOKENS at a time.

        Safe for in-place compaction (``dst[i] <= src[i]``, both increasing): a chunk's sources
        are read before its destinations are written, and later chunks read only slots above it.
        """
        for i in range(0, int(src.numel()), STAGE_TOKENS):
            k, v = self.read(src[i : i + STAGE_TOKENS])
            self.write(dst[i : i + STAGE_TOKENS], k, v)

    # ---- internals -----------------------------------------------------------------------
    def _empty(self, slots: int) -> torch.Tensor:
        s = self.shape
        return torch.empty(s.layers, s.kv_heads, slots, s.head_dim, dtype=s.dtype, device=s.device)

    def _take(self, i: int, n: int) -> Extent:
        s, e = self._free[i]
        if e - s == n:
            del self._free[i]
        else:
            self._free[i][0] = s + n
        self.used += n
        self.peak_used = max(self.peak_used, self.used)
        return Extent(s, n)

    def _ensure(self, n: int, contiguous: bool) -> None:
        short = n - (self.largest_free() if contiguous else self.free_slots)
        if short <= 0:
            return
        if self.fixed:
            raise PoolExhausted(f"{n} slots asked, {self.free_slots} free of {self.capacity}")
        self._grow(max(self.capacity, short, 256))

    def _grow(self, extra: int) -> None:
        """Unbounded pools only: ``extra`` more slots at the end (one copy of the used data)."""
        old = self.capacity
        self.keys = torch.cat([self.keys, self._empty(extra)], dim=2)
        self.values = torch.cat([self.values, self._empty(extra)], dim=2)
        if self._free and self._free[-1][1] == old:
            self._free[-1][1] = old + extra
        else:
            self._free.append([old, old + extra])
