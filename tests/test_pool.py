"""Device pool: allocation accounting, no overlap, arenas, data movement (Hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arbor_runtime.kv import DevicePool, Extent, KVShape, PoolExhausted

SHAPE = KVShape(layers=2, kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))


def owned_slots(extents) -> list[int]:
    return [s for e in extents for s in range(e.start, e.end)]


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["alloc", "free", "extend"]), st.integers(1, 40), st.integers(0, 99)), max_size=40
    )
)
def test_fixed_pool_hands_out_disjoint_slots_and_counts_them(ops):
    pool = DevicePool(SHAPE, 64, fixed=True)
    held: list[Extent] = []
    for op, n, pick in ops:
        if op == "alloc":
            if n > pool.free_slots:
                try:
                    pool.alloc(n)
                    raise AssertionError("allocated more than is free")
                except PoolExhausted:
                    continue
            got = pool.alloc(n)
            assert sum(e.length for e in got) == n
            held += got
        elif op == "free" and held:
            pool.free(held.pop(pick % len(held)))
        elif op == "extend" and held:
            i = pick % len(held)
            gained = pool.extend(held[i], n)
            held[i] = Extent(held[i].start, held[i].length + gained)
        slots = owned_slots(held)
        assert len(slots) == len(set(slots)) == pool.used <= pool.capacity == 64
        free = owned_slots(pool.free_extents())
        assert not set(free) & set(slots) and len(free) + len(slots) == 64
    assert pool.peak_used <= 64


def test_unbounded_pool_adds_arenas_without_moving_data():
    pool = DevicePool(SHAPE, 0, fixed=False)
    assert pool.capacity == 0 and pool.nbytes == 0  # nothing until first use
    first = pool.alloc(1000)
    k = torch.randn(2, 2, 1000, 4)
    pool.write(torch.tensor(owned_slots(first)), k, -k)
    second = pool.alloc(2000)  # does not fit the first arena's 24 free slots: spans two arenas
    assert len(pool.arenas) == 2 and sum(e.length for e in second) == 2000 and len(second) == 2
    k2 = torch.randn(2, 2, 2000, 4)
    pool.write(torch.tensor(owned_slots(second)), k2, k2 * 2)
    back_k, back_v = pool.read(torch.tensor(owned_slots(first)))
    assert torch.equal(back_k, k) and torch.equal(back_v, -k)
    mixed = torch.tensor(owned_slots(second)[::-7])  # slots from both arenas, any order
    gk, gv = pool.gather_layer(1, mixed)
    ref = k2[1][:, list(range(2000))[::-7]]
    assert torch.equal(gk, ref) and torch.equal(gv, 2 * ref)
    for e in second:  # a layer view never crosses an arena
        view, _ = pool.layer_view(0, e)
        assert view.shape == (2, e.length, 4)


def test_compacting_move_keeps_the_kept_tokens():
    pool = DevicePool(SHAPE, 300, fixed=True)
    (ext,) = pool.alloc(300)
    data = torch.randn(2, 2, 300, 4)
    pool.write(torch.arange(300), data, data)
    keep = torch.tensor(sorted({0, 3, 4, 5, 90, 91, 200, *range(210, 290)}))
    pool.move(keep, torch.arange(keep.numel()))  # dst <= src: in place, staged
    k, _ = pool.read(torch.arange(keep.numel()))
    assert torch.equal(k, data[:, :, keep])
