"""Host tier: slot pool accounting, spans addressed by slots, bit-identical round trips (Hypothesis).

Runs on the CPU with synchronous lanes (the same code CUDA runs, without pinning) and with the
recording lanes whose events never complete (every wait the CUDA path takes is taken).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arbor_runtime.kv import BlockKV, KVShape, KVStore
from arbor_runtime.kv.host import HostFull, HostSlots, slot_runs
from arbor_runtime.kv.streams import RecordingStreams, SyncStreams

SHAPE = KVShape(layers=3, kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))


def held_slots(extents) -> list[int]:
    return [s for e in extents for s in range(e.start, e.end)]


@settings(max_examples=80, deadline=None)
@given(
    chunk=st.integers(1, 9),
    limit=st.one_of(st.none(), st.integers(0, 40)),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 15), st.integers(0, 99)), max_size=40),
)
def test_slot_pool_hands_out_disjoint_slots_grows_in_chunks_and_respects_the_limit(chunk, limit, ops):
    slots = HostSlots(chunk, limit)
    held: list[list[int]] = []
    peak = 0
    for alloc, n, pick in ops:
        if alloc:
            if limit is not None and slots.used + n > limit:
                with pytest.raises(HostFull):
                    slots.alloc(n)
                continue
            got = slots.alloc(n)
            assert sum(e.length for e in got) == n
            for e in got:  # an extent never crosses a chunk
                assert slots.chunk_of(e.start) == slots.chunk_of(e.end - 1)
            held.append(held_slots(got))
        elif held:
            part = held.pop(pick % len(held))
            keep = part[: pick % (len(part) + 1)]  # partial frees: any subset goes back
            slots.free(torch.tensor(part[len(keep) :], dtype=torch.long))
            if keep:
                held.append(keep)
        owned = [s for h in held for s in h]
        peak = max(peak, len(owned))
        free = held_slots(slots.free_ranges())
        assert len(owned) == len(set(owned)) == slots.used
        assert not set(owned) & set(free) and len(owned) + len(free) == slots.capacity
        assert limit is None or slots.capacity <= limit
        # chunks are `chunk` slots each (the last may be cut by the limit), added only when needed
        sizes = [b - a for a, b in zip(slots.bounds, slots.bounds[1:], strict=False)]
        assert all(s == chunk for s in sizes[:-1]) and (not sizes or 0 < sizes[-1] <= chunk)
        assert not sizes or slots.capacity - sizes[-1] < peak  # the last chunk was needed once


def test_slot_pool_refuses_double_frees():
    slots = HostSlots(4)
    (ext,) = slots.alloc(3)
    slots.free(torch.tensor([ext.start]))
    with pytest.raises(ValueError, match="not all allocated"):
        slots.free(torch.tensor([ext.start]))
    with pytest.raises(ValueError, match="given twice"):
        slots.free(torch.tensor([ext.start + 1, ext.start + 1]))


def test_slot_runs_split_at_gaps_and_chunk_bounds():
    assert slot_runs(torch.tensor([7, 3, 4, 5, 8, 12])) == [(3, 6), (7, 9), (12, 13)]
    assert slot_runs(torch.tensor([2, 3, 4, 5]), bounds=[0, 4, 8]) == [(2, 4), (4, 6)]


def new_store(streams, blocks=(10, 7, 12), device_slots: int | None = 40, host_chunk=5, host_cap=None):
    """A store with random K/V blocks; returns it and each block's (L, H, T, D) K and V."""
    store = KVStore(SHAPE, capacity=device_slots, host_capacity=host_cap, streams=streams)
    store.host.slots.chunk = host_chunk  # small chunks: spans cross chunks, the pool grows often
    data = {}
    gen = torch.Generator().manual_seed(0)
    for bid, n in enumerate(blocks):
        extents = store.pool.alloc(n)
        store.put(bid, BlockKV.from_extents(extents, start_pos=0, next_logits=None))
        k = torch.randn(SHAPE.layers, SHAPE.kv_heads, n, SHAPE.head_dim, generator=gen)
        v = torch.randn(k.shape, generator=gen)
        store.pool.write(torch.cat([torch.arange(e.start, e.end) for e in extents]), k, v)
        data[bid] = (k, v)
    return store, data


def check_store(store: KVStore, data) -> None:
    """Device tokens and host spans hold exactly the original K/V; host accounting adds up."""
    store.prefetch()
    host_slots = []
    for bid, (k, v) in data.items():
        blk = store.get(bid)
        dk, dv = store.read(bid)
        assert torch.equal(dk, k[:, :, blk.kept]) and torch.equal(dv, v[:, :, blk.kept])
        if bid in store.host:
            idx, hk, hv = store.host.read(bid)
            assert not bool(torch.isin(idx, blk.kept).any())  # a token is on one tier at a time
            assert torch.equal(hk, k[:, :, idx]) and torch.equal(hv, v[:, :, idx])
            host_slots += store.host._spans[bid].slots.tolist()
    assert len(host_slots) == len(set(host_slots)) == store.host.tokens == store.host.slots.used
    assert store.resident_tokens == sum(store.get(b).kept_tokens for b in data) == store.pool.used


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.integers(0, 2), st.sampled_from(["apply", "apply", "drop_host", "prefetch"]), st.integers(0, 2**12)
        ),
        max_size=14,
    ),
    recording=st.booleans(),
)
def test_evict_merge_and_partial_restore_are_bit_identical_and_move_no_host_data(ops, recording):
    store, data = new_store(RecordingStreams() if recording else SyncStreams())
    chunk_ptrs: dict[int, int] = {}
    for bid, op, bits in ops:
        blk = store.get(bid)
        if op == "apply":  # any subset stays: evicts the rest, restores what the host has of it
            keep = torch.tensor([i for i in range(blk.length) if bits >> (i % 12) & 1], dtype=torch.long)
            hosted = store.host.indices(bid)
            there = set(blk.kept.tolist()) | set([] if hosted is None else hosted.tolist())
            store.apply(bid, keep, offload=True)
            assert blk.kept.tolist() == sorted(set(keep.tolist()) & there)  # dropped tokens cannot come back
        elif op == "drop_host":
            store.drop_host(bid)
        else:
            store.prefetch()
        for i, chunk in enumerate(store.host._chunks):  # chunks are allocated once, never copied
            assert chunk_ptrs.setdefault(i, chunk.data_ptr()) == chunk.data_ptr()
        check_store(store, data)


def test_partial_restore_takes_exactly_the_asked_tokens():
    store, data = new_store(SyncStreams())
    store.apply(0, torch.tensor([0, 1]), offload=True)  # 8 tokens to the host
    store.apply(0, torch.tensor([0, 1, 5, 9]), offload=True)  # 2 of them back: a partial restore
    assert store.host.indices(0).tolist() == [2, 3, 4, 6, 7, 8]
    assert store.get(0).kept.tolist() == [0, 1, 5, 9]
    store.apply(0, torch.tensor([0]), offload=True)  # merge: 3 more tokens join the span
    assert store.host.indices(0).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    check_store(store, data)
    assert store.counters.rehydrated_tokens == 2 and store.host.bytes_to_device == 2 * SHAPE.bytes_per_token


def test_a_full_host_tier_drops_what_does_not_fit_and_says_so():
    store, data = new_store(SyncStreams(), host_cap=6)
    store.apply(0, torch.tensor([0, 1]), offload=True)  # 8 leave, 6 fit
    assert store.host.tokens == 6 and store.dropped(0) == 2 and store.counters.host_full_tokens == 2
    assert store.host.slots.capacity <= 6
    check_store(store, data)


def test_restores_wait_for_the_offload_that_wrote_their_host_slots():
    streams = RecordingStreams()
    store, _ = new_store(streams)
    store.apply(1, torch.tensor([0]), offload=True)
    store.apply(1, torch.arange(7), offload=True)
    store.prefetch()
    log = streams.log
    put_done = max(i for i, e in enumerate(log) if e[:2] == ("record", "offload"))
    serial = log[put_done][2]
    restore_at = log.index(("enter", "restore"))
    assert ("wait", "restore", "offload", serial) in log[put_done:restore_at]  # on the device, not the host
    assert not any(e[0] == "synchronize" for e in log)


def test_round_trip_across_the_arenas_of_an_unbounded_pool():
    store, data = new_store(SyncStreams(), blocks=(700, 1500, 300), device_slots=None, host_chunk=512)
    assert len(store.pool.arenas) > 1  # blocks span arenas: gathers and scatters split by arena
    for bid, (k, _) in data.items():
        store.apply(bid, torch.arange(0, k.shape[2], 3), offload=True)
    check_store(store, data)
    for bid, (k, _) in data.items():
        store.apply(bid, torch.arange(k.shape[2]), offload=True)
    check_store(store, data)
    assert all(store.get(b).whole for b in data) and store.host.tokens == 0


def test_arbor_host_budget_bounds_the_host_pool_and_recompute_keeps_it_exact(tiny, one_torch_thread):
    from fixtures.synthetic import synthetic_search

    from arbor_runtime import Runtime
    from arbor_runtime.policies.arbor import ArborPolicy

    trees = {}
    for host_cap in (None, 24):
        rt = Runtime(tiny, policy=ArborPolicy(budget_tokens=60, host_budget_tokens=host_cap), seed=3)
        synthetic_search(rt, "Input: 4 4 6 8\nSteps:\n", expansions=6, n=2, max_new_tokens=6, temperature=0.0, seed=5)
        trees[host_cap] = [n.token_ids for n in rt.all_nodes.values()]
        if host_cap is not None:
            assert rt.store.host.slots.capacity <= host_cap and rt.metrics.peak_host_tokens <= host_cap
            assert rt.metrics.recomputed_tokens > 0  # what the host could not keep came back by recompute
    assert trees[None] == trees[24]


def test_the_host_tier_is_bounded_by_default_by_a_share_of_available_memory(tiny, monkeypatch):
    """Issue 47: with no ``host_budget_tokens`` the host tier grew without bound (14,333 host tokens
    against a 700-token device budget in one run). Now it holds at most ``HOST_SHARE`` of the host
    memory available when the runtime starts; what does not fit is dropped and recomputed on return."""
    import arbor_runtime.kv.host as host_module
    from arbor_runtime import Runtime, SamplingParams

    per_token = Runtime(tiny).backend.shape.bytes_per_token
    assert host_module.available_host_bytes() > 0
    monkeypatch.setattr(host_module, "available_host_bytes", lambda: 1 << 30)
    assert Runtime(tiny, policy="arbor", budget_tokens=64).store.host.slots.limit == (1 << 29) // per_token
    cap = 6
    monkeypatch.setattr(host_module, "available_host_bytes", lambda: int(cap * per_token / host_module.HOST_SHARE))
    rt = Runtime(tiny, policy="arbor", budget_tokens=45)
    assert rt.policy.host_budget_tokens is None and rt.store.host.slots.limit == cap
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kids = rt.expand(root, 3, greedy)
    deep = kids[2]
    for _ in range(4):
        deep = rt.expand(deep, 1, greedy)[0]
    assert rt.metrics.peak_host_tokens <= cap and all(p.host_tokens <= cap for p in rt.metrics.trace)
    assert rt.store.counters.host_full_tokens > 0  # the overflow was dropped, not kept
    gone = next(k for k in kids[:2] if rt.residency(k)["host"] < k.length - rt.residency(k)["device"])
    rt.expand(gone, 1, greedy)  # the search returns: what was dropped is recomputed
    assert rt.metrics.recomputed_tokens > 0 and rt.store.get(gone.id).whole
