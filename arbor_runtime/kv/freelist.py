"""Free list of token slots: the one allocator under the device pool and the host tier.

Pure bookkeeping, no tensors. Slots ``[0, capacity)`` come in segments (the pool's arenas, the
host tier's chunks) added at the end with :meth:`FreeList.grow`. Free slots are kept as sorted
``[start, end)`` ranges that never cross a segment bound, merged with their free neighbours
inside a segment. Allocation is first-fit: the first free range that holds the request, else the
request split over the first ranges in order (so an allocation succeeds exactly when enough
slots are free; fragmentation costs extents, never slots). Growing a segment's memory, and what
a shortage means (grow, or an error of the caller's), is the owner's business.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Extent:
    """A run of ``length`` consecutive slots starting at global slot ``start`` (inside one segment)."""

    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


class FreeList:
    """Which slots are free, in segments ``[bounds[i], bounds[i + 1])``.

    Args:
        label: what the slots are, in error messages ("host slots").

    Attributes:
        bounds: segment starts, then ``capacity`` (``[0]`` while empty).
        used: slots handed out and not given back; peak_used: the most ``used`` has been.
    """

    def __init__(self, label: str = "slots") -> None:
        self.label = label
        self.bounds: list[int] = [0]
        self.used = 0
        self.peak_used = 0
        self._free: list[list[int]] = []  # sorted [start, end); a free range never crosses a segment

    # ---- queries -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Slots in the segments added so far."""
        return self.bounds[-1]

    @property
    def free_slots(self) -> int:
        return self.capacity - self.used

    @property
    def segments(self) -> int:
        return len(self.bounds) - 1

    def segment_of(self, slot: int) -> int:
        """Index of the segment holding ``slot``."""
        return bisect.bisect_right(self.bounds, slot) - 1

    def starts_segment(self, slot: int) -> bool:
        """Whether ``slot`` is the first of a segment (an extent ending just before it cannot grow into it)."""
        i = bisect.bisect_left(self.bounds, slot)
        return i < len(self.bounds) and self.bounds[i] == slot

    def largest(self) -> int:
        """Slots of the largest free range (the most one extent can get)."""
        return max((e - s for s, e in self._free), default=0)

    def extents(self) -> list[Extent]:
        """The free ranges, in slot order."""
        return [Extent(s, e - s) for s, e in self._free]

    # ---- updates -------------------------------------------------------------------------
    def grow(self, n: int) -> Extent:
        """Add a segment of ``n`` free slots after the last; returns it."""
        if n < 1:
            raise ValueError(f"a segment of {n} slots: must be at least 1")
        start = self.capacity
        self.bounds.append(start + n)
        self._free.append([start, start + n])
        return Extent(start, n)

    def alloc(self, n: int) -> list[Extent]:
        """``n`` slots: one extent from the first free range that holds them, else split over the
        first free ranges in slot order. Raises MemoryError when fewer than ``n`` are free (owners
        check, or grow, first)."""
        if n <= 0:
            return []
        if n > self.free_slots:
            raise MemoryError(f"{n} {self.label} asked, {self.free_slots} free of {self.capacity}")
        for i, (s, e) in enumerate(self._free):
            if e - s >= n:
                return [self._take(i, n)]
        out, left = [], n
        while left:
            s, e = self._free[0]
            out.append(self._take(0, min(left, e - s)))
            left -= out[-1].length
        return out

    def extend(self, ext: Extent, n: int) -> int:
        """Grow ``ext`` in place into the free range that starts right at its end, by up to ``n``
        slots; returns the slots gained (0: its next slot is not free, or starts another segment:
        an extent never crosses a segment, since a segment's slots are one tensor)."""
        if ext.length and self.starts_segment(ext.end):  # its last slot ends a segment
            return 0
        for i, (s, e) in enumerate(self._free):
            if s == ext.end:
                got = min(n, e - s)
                self._take(i, got)
                return got
            if s > ext.end:
                break
        return 0

    def free(self, extents: Iterable[Extent]) -> None:
        """Give ``extents`` back (any order); each is merged with its free neighbours in the
        segment of its first slot.

        Raises ValueError, before anything is given back, when a slot is not allocated (given
        twice, or beyond the capacity).
        """
        runs = sorted((e.start, e.end) for e in extents if e.length > 0)
        prev = -1
        for s, e in runs:
            if s < max(prev, 0) or e > self.capacity or self._overlaps_free(s, e):
                raise ValueError(f"{self.label} [{s}, {e}) are not all allocated (or given twice)")
            prev = e
        for s, e in runs:
            self._give(s, e)

    # ---- internals -----------------------------------------------------------------------
    def _take(self, i: int, n: int) -> Extent:
        s, e = self._free[i]
        if e - s == n:
            del self._free[i]
        else:
            self._free[i][0] = s + n
        self.used += n
        self.peak_used = max(self.peak_used, self.used)
        return Extent(s, n)

    def _overlaps_free(self, s: int, e: int) -> bool:
        """Whether ``[s, e)`` meets a free range (ranges are sorted and disjoint: only the last
        one starting before ``e`` can)."""
        i = bisect.bisect_left(self._free, [e, -1])
        return i > 0 and self._free[i - 1][1] > s

    def _give(self, lo: int, hi: int) -> None:
        n, seg = hi - lo, self.segment_of(lo)
        base, end = self.bounds[seg], self.bounds[seg + 1]
        keep = []
        for s, e in self._free:
            if e == lo and s >= base:
                lo = s
            elif s == hi and e <= end:
                hi = e
            else:
                keep.append([s, e])
        keep.append([lo, hi])
        keep.sort()
        self._free = keep
        self.used -= n
