"""Device KV pool: preallocated token slots for every layer, handed out as ranges.

Every KV tensor the runtime keeps on the device lives here: retained block tokens and the slots
of rows being generated. With a budget the pool is one arena of exactly ``budget_tokens`` slots,
allocated once, so device KV can never pass the budget whatever the bookkeeping says. Without
one, arenas are added as the tree grows (never copied: a new arena is just more slots). Slots
have global ids; a range never crosses an arena. Ranges are handed out first-fit by a
:class:`~arbor_runtime.kv.freelist.FreeList` whose segments are the arenas; a request that no single
free range can hold is split over several (a block is a list of segments), so an allocation
succeeds exactly when enough slots are free: fragmentation costs extra attention calls, never
memory. Moves inside the pool go through a staging chunk of at most ``STAGE_TOKENS`` slots.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arbor_runtime.errors import BudgetError
from arbor_runtime.kv.freelist import Extent, FreeList

#: tokens moved per staging copy inside the pool (bounded scratch, independent of context)
STAGE_TOKENS = 64
#: slots of each arena an unbounded pool adds (or what the request needs, if more)
ARENA_SLOTS = 1024


def available_host_bytes() -> int:
    """Bytes of host memory available now (``psutil``'s ``available``, else free pages from sysconf)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_device_bytes(device: torch.device) -> int:
    """Bytes free now on ``device``: a CUDA device's free memory, else the host's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_host_bytes()


def check_pool_fits(
    slots: int,
    bytes_per_token: int,
    device: torch.device | str,
    what: str = "budget_tokens",
    reserved: int = 0,
    free: int | None = None,
    valid: str = "",
) -> None:
    """A pool of ``slots`` token slots must fit in the memory free on ``device`` (less ``reserved`` bytes:
    the weights a model will take, when it is not loaded yet); BudgetError in one line naming ``what``,
    its size and the most that fits otherwise. ``free``: the bytes free, when known (else measured)."""
    free = (free_device_bytes(torch.device(device)) if free is None else free) - reserved
    need = slots * bytes_per_token
    if need > free:
        most = max(free, 0) // bytes_per_token
        beside = " beside the model" if reserved else ""
        raise BudgetError(
            f"{what}={slots} needs {_size(need)} of KV ({bytes_per_token:,} bytes a token), more than the "
            f"{_size(max(free, 0))} {torch.device(device).type} has free{beside}; valid: at most {most:,} tokens{valid}"
        )


class PoolExhausted(MemoryError):
    """More slots were asked for than the pool has free (a scheduling bug: plans check first)."""


@dataclass(slots=True)
class _Arena:
    """Slots [base, base + capacity): keys / values (L, H_kv, capacity, D)."""

    base: int
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[2])

    @property
    def end(self) -> int:
        return self.base + self.capacity


class DevicePool:
    """K/V slots for every layer, in one arena (a budget) or a growing list of arenas.

    Args:
        shape: the model's KV geometry (layers, kv heads, head dim, dtype, device).
        capacity: slots of the first arena; with ``fixed`` the pool never grows past it (the budget).
        fixed: True when ``capacity`` is a hard budget; False adds arenas when full.
    """

    def __init__(self, shape, capacity: int, fixed: bool) -> None:
        self.shape, self.fixed = shape, fixed
        self.arenas: list[_Arena] = []
        self._slots = FreeList("pool slots")  # its segments are the arenas
        if capacity:
            self._add_arena(capacity)

    # ---- queries -------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.shape.device

    @property
    def capacity(self) -> int:
        return self._slots.capacity

    @property
    def used(self) -> int:
        return self._slots.used

    @property
    def peak_used(self) -> int:
        return self._slots.peak_used

    @property
    def free_slots(self) -> int:
        return self._slots.free_slots

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds on the device (all slots, used or not)."""
        return sum(2 * a.keys.numel() * a.keys.element_size() for a in self.arenas)

    def largest_free(self) -> int:
        return self._slots.largest()

    def free_extents(self) -> list[Extent]:
        return self._slots.extents()

    # ---- allocation ----------------------------------------------------------------------
    def alloc(self, n: int, contiguous: bool = False) -> list[Extent]:
        """``n`` slots as one extent when a free range holds them, else split over several.

        Raises :class:`PoolExhausted` when fewer than ``n`` slots are free in a fixed pool, or when
        ``contiguous`` and no single range fits.
        """
        if n <= 0:
            return []
        self._ensure(n, contiguous)
        if contiguous and self.largest_free() < n:
            raise PoolExhausted(f"no free range of {n} slots (largest {self.largest_free()})")
        return self._slots.alloc(n)

    def joins(self, last: Extent, ext: Extent) -> bool:
        """Whether ``ext`` continues ``last`` inside one arena (so the two can be one extent)."""
        return last.end == ext.start and not (last.length and self._slots.starts_segment(ext.start))

    def extend(self, ext: Extent, n: int) -> int:
        """Grow ``ext`` in place into the free range right after it, by up to ``n`` slots; returns the slots gained."""
        return self._slots.extend(ext, n)

    def free(self, ext: Extent) -> None:
        """Give ``ext``'s slots back (merged with free neighbours of the same arena).

        Raises ValueError for slots that are not allocated (given twice).
        """
        self._slots.free([ext])

    # ---- data access ---------------------------------------------------------------------
    def layer_view(self, layer: int, ext: Extent) -> tuple[torch.Tensor, torch.Tensor]:
        """(H_kv, length, D) strided views of one layer's K and V over ``ext``: no copy."""
        arena = self._arena_of(ext.start)
        a, b = ext.start - arena.base, ext.end - arena.base
        if b > arena.capacity:  # a slice past the arena would silently hold fewer keys
            raise ValueError(f"extent [{ext.start}, {ext.end}) crosses the end of its arena at {arena.end}")
        return arena.keys[layer, :, a:b], arena.values[layer, :, a:b]

    def gather_runs(
        self, layer: int, slots: torch.Tensor, runs: Sequence[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of one layer's K and V at context ``slots`` (N,), which lie in the slot ``runs``
        ([lo, hi) each): (H_kv, N, D) each. Unlike a row's slots (:meth:`gather_layer`), context
        slots may be a restore's target: a fenced pool waits for those restores first."""
        return self.gather_layer(layer, slots)

    def gather_layer(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of one layer's K and V at ``slots`` (N,): (H_kv, N, D) each."""
        if len(self.arenas) == 1:
            local = slots.to(self.device) - self.arenas[0].base
            return self.arenas[0].keys[layer].index_select(1, local), self.arenas[0].values[layer].index_select(
                1, local
            )
        k = self._empty_layer(int(slots.numel()))
        v = torch.empty_like(k)
        for arena, pos, local in self._by_arena(slots):
            k[:, pos] = arena.keys[layer].index_select(1, local)
            v[:, pos] = arena.values[layer].index_select(1, local)
        return k, v

    def write_layer(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store one layer's (H_kv, N, D) K/V into ``slots`` (N,)."""
        for arena, pos, local in self._by_arena(slots):
            arena.keys[layer].index_copy_(1, local, keys[:, pos].to(arena.keys.dtype))
            arena.values[layer].index_copy_(1, local, values[:, pos].to(arena.values.dtype))

    def gather_heads(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of one layer's K and V with each KV head read at its own slots: ``slots``
        (H_kv, N) -> (H_kv, N, D) each (per-head retention, :meth:`KVStore.apply_heads`)."""
        k = self._empty_layer(int(slots.shape[1]))
        v = torch.empty_like(k)
        for h in range(slots.shape[0]):
            for arena, pos, local in self._by_arena(slots[h]):
                k[h, pos] = arena.keys[layer, h].index_select(0, local)
                v[h, pos] = arena.values[layer, h].index_select(0, local)
        return k, v

    def write_heads(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store one layer's (H_kv, N, D) K/V, each KV head into its own ``slots`` (H_kv, N)."""
        for h in range(slots.shape[0]):
            for arena, pos, local in self._by_arena(slots[h]):
                arena.keys[layer, h].index_copy_(0, local, keys[h, pos].to(arena.keys.dtype))
                arena.values[layer, h].index_copy_(0, local, values[h, pos].to(arena.values.dtype))

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the K/V in ``slots`` (N,) for every layer: (L, H_kv, N, D) each."""
        if len(self.arenas) == 1:
            local = slots.to(self.device) - self.arenas[0].base
            return self.arenas[0].keys.index_select(2, local), self.arenas[0].values.index_select(2, local)
        s = self.shape
        k = torch.empty(s.layers, s.kv_heads, int(slots.numel()), s.head_dim, dtype=s.dtype, device=s.device)
        v = torch.empty_like(k)
        for arena, pos, local in self._by_arena(slots):
            k[:, :, pos] = arena.keys.index_select(2, local)
            v[:, :, pos] = arena.values.index_select(2, local)
        return k, v

    def write(self, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store (L, H_kv, N, D) K/V into ``slots`` (N,)."""
        keys, values = keys.to(self.device), values.to(self.device)
        for arena, pos, local in self._by_arena(slots):
            arena.keys.index_copy_(2, local, keys[:, :, pos].to(arena.keys.dtype))
            arena.values.index_copy_(2, local, values[:, :, pos].to(arena.values.dtype))

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` (N,) to ``dst`` (N,), STAGE_TOKENS at a time.

        Safe for in-place compaction (``dst[i] <= src[i]``, both increasing): a chunk's sources
        are read before its destinations are written, and later chunks read only slots above it.
        """
        for i in range(0, int(src.numel()), STAGE_TOKENS):
            k, v = self.read(src[i : i + STAGE_TOKENS])
            self.write(dst[i : i + STAGE_TOKENS], k, v)

    # ---- internals -----------------------------------------------------------------------
    def _arena_of(self, slot: int) -> _Arena:
        i = bisect.bisect_right([a.base for a in self.arenas], slot) - 1
        return self.arenas[i]

    def _by_arena(self, slots: torch.Tensor):
        """(arena, positions in ``slots``, arena-local slots) for each arena the slots touch."""
        slots = slots.to(self.device)
        if len(self.arenas) == 1:
            arena = self.arenas[0]
            yield arena, slice(None), slots - arena.base
            return
        for arena in self.arenas:
            pos = torch.nonzero((slots >= arena.base) & (slots < arena.end)).squeeze(1)
            if pos.numel():
                yield arena, pos, slots[pos] - arena.base

    def _empty_layer(self, n: int) -> torch.Tensor:
        s = self.shape
        return torch.empty(s.kv_heads, n, s.head_dim, dtype=s.dtype, device=s.device)

    def _add_arena(self, slots: int) -> None:
        """An arena of ``slots`` slots; BudgetError, one line, when the device has not the memory for it
        (a budget of 10**12 tokens is refused here, not by the allocator's own message)."""
        s = self.shape
        size = (s.layers, s.kv_heads, slots, s.head_dim)
        what = "budget_tokens" if self.fixed else "the growing pool's next arena"
        check_pool_fits(slots, s.bytes_per_token, s.device, what=what)
        try:
            keys = torch.empty(size, dtype=s.dtype, device=s.device)
            values = torch.empty_like(keys)
        except RuntimeError:  # torch.OutOfMemoryError is one: the memory went between the check and here
            check_pool_fits(slots, s.bytes_per_token, s.device, what=what, free=0)
        base = self._slots.grow(slots).start
        self.arenas.append(_Arena(base, keys, values))

    def _ensure(self, n: int, contiguous: bool) -> None:
        short = n - (self.largest_free() if contiguous else self.free_slots)
        if short <= 0:
            return
        if self.fixed:
            raise PoolExhausted(f"{n} slots asked, {self.free_slots} free of {self.capacity}")
        self._add_arena(max(n if contiguous else short, ARENA_SLOTS))


def _size(n: float) -> str:
    """Bytes as text in the largest unit under 1024 ("1.5 GiB", "512 B")."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"
