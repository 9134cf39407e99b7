"""Slot allocation of the device pool and the host tier: the slots handed out are pinned.

Traces, trees and byte counts compare slots, so the allocators must keep choosing the same slots.
Each case runs a fixed pseudo-random sequence of allocations, growths and (partial) frees and
records every extent handed out and the free ranges after each step; the digests below were taken
before both allocators were moved onto one free list (issue 22, main at e0b0118). The logic is pure
integer bookkeeping, so the digests do not depend on the platform.
"""

from __future__ import annotations

import hashlib
import json
import random

import pytest
import torch

from arbor_runtime.kv import DevicePool, Extent, KVShape, PoolExhausted
from arbor_runtime.kv import pool as pool_module
from arbor_runtime.kv.freelist import FreeList
from arbor_runtime.kv.host import HostFull, HostSlots

SHAPE = KVShape(layers=1, kv_heads=1, head_dim=1, dtype=torch.float32, device=torch.device("cpu"))


def ext_list(extents) -> list[list[int]]:
    return [[e.start, e.length] for e in extents]


def pool_trace(seed: int, capacity: int, fixed: bool, steps: int = 300) -> list:
    """What a pool hands out under a random mix of alloc (some contiguous), extend and partial free."""
    rng = random.Random(seed)
    pool = DevicePool(SHAPE, capacity, fixed=fixed)
    held: list[Extent] = []
    trace: list = []
    for _ in range(steps):
        op = rng.choice(["alloc", "alloc", "contig", "extend", "free", "free", "free_part"])
        if op in ("alloc", "contig"):
            n = rng.randint(0, 24)
            try:
                got = pool.alloc(n, contiguous=op == "contig")
            except PoolExhausted as e:
                trace.append([op, n, str(e)])
                continue
            held += got
            trace.append([op, n, ext_list(got)])
        elif op == "extend" and held:
            i = rng.randrange(len(held))
            n = rng.randint(1, 12)
            got = pool.extend(held[i], n)
            held[i] = Extent(held[i].start, held[i].length + got)
            trace.append([op, i, n, got])
        elif op == "free" and held:
            ext = held.pop(rng.randrange(len(held)))
            pool.free(ext)
            trace.append([op, [ext.start, ext.length]])
        elif op == "free_part" and held:  # the store gives back a segment's tail
            i = rng.randrange(len(held))
            ext = held[i]
            k = rng.randint(0, ext.length)
            pool.free(Extent(ext.start + k, ext.length - k))
            held[i] = Extent(ext.start, k)
            trace.append([op, i, k])
        trace.append([ext_list(pool.free_extents()), pool.used, pool.peak_used, pool.capacity, pool.largest_free()])
    return trace


def host_trace(seed: int, chunk: int, limit: int | None, steps: int = 300) -> list:
    """What the host slot accounting hands out under random allocs and frees of any subset."""
    rng = random.Random(seed)
    slots = HostSlots(chunk, limit)
    held: list[list[int]] = []
    trace: list = []
    for _ in range(steps):
        if rng.random() < 0.5:
            n = rng.randint(0, 20)
            try:
                got = slots.alloc(n)
            except HostFull as e:
                trace.append(["alloc", n, str(e)])
                continue
            held.append([s for e in got for s in range(e.start, e.end)])
            trace.append(["alloc", n, ext_list(got)])
        elif held:
            part = held.pop(rng.randrange(len(held)))
            rng.shuffle(part)
            k = rng.randint(0, len(part))
            slots.free(torch.tensor(part[k:], dtype=torch.long))
            if k:
                held.append(part[:k])
            trace.append(["free", sorted(part[k:])])
        trace.append([ext_list(slots.free_ranges()), slots.used, slots.capacity, slots.bounds, slots.room()])
    return trace


def digest(trace: list) -> str:
    return hashlib.sha256(json.dumps(trace).encode()).hexdigest()[:16]


POOL_CASES = {  # (seed, capacity, fixed) -> digest of pool_trace
    (0, 64, True): "1d63357c694d85f9",
    (1, 64, True): "bf8441466fb24341",
    (2, 200, True): "79121ba7a92d02c0",
    (3, 0, False): "b821da4c88bc3575",
    (4, 16, False): "3d867df4eb0e2ef6",
    (5, 0, False): "4cf7ceb93ba30c3c",
}
HOST_CASES = {  # (seed, chunk, limit) -> digest of host_trace
    (0, 8, None): "b6246f1a4c25b510",
    (1, 8, 50): "59993ac48b5b2760",
    (2, 1, 30): "353abff05e4d6263",
    (3, 5, None): "a75a8714e8a95666",
    (4, 64, 100): "449f2a6640491f8f",
}


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_device_pool_hands_out_the_same_slots(case, monkeypatch):
    monkeypatch.setattr(pool_module, "ARENA_SLOTS", 32)  # unbounded pools: several arenas
    trace = pool_trace(*case)
    assert any(step[0] == "extend" and step[3] for step in trace if isinstance(step[0], str))
    assert digest(trace) == POOL_CASES[case]


@pytest.mark.parametrize("case", list(HOST_CASES))
def test_host_slots_hand_out_the_same_slots(case):
    trace = host_trace(*case)
    assert digest(trace) == HOST_CASES[case]


# ---- the free list itself ---------------------------------------------------------------------
def test_free_list_coalesces_inside_a_segment_never_across():
    fl = FreeList()
    fl.grow(10)
    fl.grow(6)  # segments [0, 10), [10, 16)
    assert fl.extents() == [Extent(0, 10), Extent(10, 6)] and fl.segment_of(10) == 1
    assert fl.alloc(12) == [Extent(0, 10), Extent(10, 2)]  # no range holds 12: split, first ranges first
    assert fl.alloc(3) == [Extent(12, 3)] and fl.used == 15 == fl.peak_used
    fl.free([Extent(4, 3), Extent(8, 2)])
    fl.free([Extent(7, 1)])  # joins both neighbours: [4, 10)
    fl.free([Extent(10, 2)])  # next to [4, 10) but in the next segment: stays apart
    assert fl.extents() == [Extent(4, 6), Extent(10, 2), Extent(15, 1)]
    assert fl.used == 7 and fl.peak_used == 15 and fl.free_slots == 9 and fl.largest() == 6
    assert fl.alloc(5) == [Extent(4, 5)]  # first fit


def test_free_list_extends_in_place_and_refuses_slots_it_does_not_hold():
    fl = FreeList("pool slots")
    fl.grow(20)
    (a,) = fl.alloc(4)
    (b,) = fl.alloc(4)
    assert fl.extend(a, 3) == 0  # b follows a
    assert fl.extend(b, 5) == 5 and fl.extend(Extent(b.start, 9), 50) == 7 and fl.free_slots == 0
    with pytest.raises(MemoryError, match="1 pool slots asked, 0 free of 20"):
        fl.alloc(1)
    fl.free([a])
    with pytest.raises(ValueError, match=r"pool slots \[0, 4\) are not all allocated"):
        fl.free([a])  # given twice
    with pytest.raises(ValueError, match="not all allocated"):
        fl.free([Extent(18, 4)])  # past the capacity
    with pytest.raises(ValueError, match="not all allocated"):
        fl.free([Extent(5, 2), Extent(6, 2)])  # the same slot twice in one call
    assert fl.used == 16  # a refused free gives nothing back
    with pytest.raises(ValueError, match="at least 1"):
        fl.grow(0)


def test_pool_refuses_a_double_free():
    pool = DevicePool(SHAPE, 8, fixed=True)
    (ext,) = pool.alloc(5)
    pool.free(ext)
    with pytest.raises(ValueError, match=r"pool slots \[0, 5\) are not all allocated \(or given twice\)"):
        pool.free(ext)
    assert pool.used == 0 and pool.free_extents() == [Extent(0, 8)]


def test_an_extent_never_grows_or_merges_across_an_arena(monkeypatch):
    """An unbounded pool's arenas are separate tensors: an extent that ended at its arena's last slot
    and grew (or was merged) into the next arena's first free slots was cut at the arena's end by
    ``layer_view``, so attention silently read fewer keys. Now it neither grows nor merges there."""
    from arbor_runtime.generation import Row

    monkeypatch.setattr(pool_module, "ARENA_SLOTS", 8)
    pool = DevicePool(SHAPE, 8, fixed=False)
    (first,) = pool.alloc(8)
    (second,) = pool.alloc(4)  # a second arena: slots [8, 16)
    assert second == Extent(8, 4)
    pool.free(second)
    assert pool.extend(first, 4) == 0  # before: 4, and first became [0, 12)
    assert not pool.joins(first, Extent(8, 4)) and pool.joins(Extent(0, 4), Extent(4, 4))
    assert pool.extend(Extent(8, 0), 2) == 2  # an empty extent at an arena's start is inside it
    with pytest.raises(ValueError, match=r"extent \[0, 12\) crosses the end of its arena at 8"):
        pool.layer_view(0, Extent(0, 12))
    row = Row.__new__(Row)
    row.extents, row.attention = [first], torch.zeros(8)
    row.add_slots(pool.alloc(2), pool.joins)
    assert row.extents == [first, Extent(10, 2)]
    row.add_slots([Extent(12, 2)], pool.joins)  # consecutive inside the arena: one extent
    assert row.extents == [first, Extent(10, 4)]
