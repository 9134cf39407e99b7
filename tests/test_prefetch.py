"""Prefetch ordering, with recording lanes: the admission plan's restores are issued before the
step's forward, compute waits for them inside the forward (per layer, on the device), nothing
synchronizes the host, and results are what synchronous copies give."""

from __future__ import annotations

import torch
from fixtures.synthetic import synthetic_search

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.kv.streams import RecordingStreams

PARAMS = SamplingParams(max_new_tokens=5, temperature=0.0)


def recorded(rt: Runtime) -> RecordingStreams:
    """Swap in recording lanes and log every model forward into the same log."""
    streams = RecordingStreams()
    rt.store.host.streams = streams
    forward = rt.backend.forward

    def logged(batch, *args, **kwargs):
        streams.log.append(("forward",))
        out = forward(batch, *args, **kwargs)
        streams.log.append(("forward_end",))
        return out

    rt.backend.forward = logged
    return streams


def restore_batches(log: list[tuple]) -> list[tuple[int, list[int], list[int]]]:
    """(log index of the batch's note, its block ids, serials of its per-layer events)."""
    out = []
    for i, entry in enumerate(log):
        if entry[0] == "restore":
            exit_at = log.index(("exit", "restore"), i)
            enter_at = log.index(("enter", "restore"), i)
            serials = [e[2] for e in log[enter_at:exit_at] if e[:2] == ("record", "restore")]
            out.append((i, entry[1], serials[1:]))  # the first record marks the start
    return out


def inside_forward(log: list[tuple], i: int) -> bool:
    starts = [j for j, e in enumerate(log[:i]) if e == ("forward",)]
    ends = [j for j, e in enumerate(log[:i]) if e == ("forward_end",)]
    return bool(starts) and (not ends or starts[-1] > ends[-1])


def test_restores_start_before_the_forward_and_compute_waits_per_layer_inside_it(tiny):
    rt = Runtime(tiny, policy="arbor", budget_tokens=10_000)
    streams = recorded(rt)
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kid = rt.expand(root, 1, PARAMS)[0]
    keys, values = rt.store.read(kid.id)
    rt.store.apply(kid.id, torch.tensor([0]), offload=True)  # kid leaves the device but its first token
    mark = len(streams.log)
    rt.expand(kid, 2, PARAMS)  # kid is on the active path: brought back before the expansion runs
    log = streams.log[mark:]
    ((note, blocks, layer_events),) = restore_batches(log)
    assert blocks == [kid.id] and len(layer_events) == tiny.model.config.num_hidden_layers
    first_forward = log.index(("forward",))
    assert note < first_forward  # issued by the admission, before the step's forward
    waits = [j for j, e in enumerate(log) if e[:3] == ("wait", "compute", "restore")]
    assert sorted(log[j][3] for j in waits) == layer_events  # one wait per layer's event
    assert all(first_forward < j and inside_forward(log, j) for j in waits)  # inside it, layer by layer
    assert not any(e[0] == "synchronize" for e in streams.log)
    assert all(torch.equal(a, b) for a, b in zip(rt.store.read(kid.id), (keys, values), strict=True))


def test_a_search_under_recording_lanes_never_restores_inside_a_forward_and_matches_sync(tiny):
    runs = {}
    for mode in ("sync", "recording"):
        rt = Runtime(tiny, policy="arbor", budget_tokens=60, seed=3)
        streams = recorded(rt) if mode == "recording" else None
        synthetic_search(rt, "Input: 4 4 6 8\nSteps:\n", expansions=7, n=2, max_new_tokens=6, release_every=4, seed=5)
        runs[mode] = rt
        if streams is not None:
            batches = restore_batches(streams.log)
            assert batches, "the search should bring evicted spans back"
            assert not any(inside_forward(streams.log, note) for note, _, _ in batches)
            assert not any(e[0] == "synchronize" for e in streams.log)
    sync, rec = runs["sync"], runs["recording"]
    assert rec.metrics.rehydrated_tokens == sync.metrics.rehydrated_tokens > 0
    assert [n.token_ids for n in rec.all_nodes.values()] == [n.token_ids for n in sync.all_nodes.values()]


def logged_admissions(rt: Runtime, streams: RecordingStreams) -> None:
    """Log every admission the memory manager carries out into the lanes' log."""
    admit = rt.memory.admit

    def logged(plan, ends):
        if plan.rows:
            streams.log.append(("admit", [n.id for n in ends]))
        return admit(plan, ends)

    rt.memory.admit = logged


def test_a_branch_switch_starts_the_new_paths_restores_before_its_rows_are_admitted(tiny):
    """Prefetch on a branch switch (issue 46): the chosen node's hosted blocks come back in one batch at
    the operation's start, before the scheduler admits its rows (on CUDA, under whatever runs until
    then), and the admission finds the path whole: same KV, same tree as restoring at admission."""
    trees, rehydrated = {}, {}
    for prefetch in (True, False):
        rt = Runtime(tiny, policy="arbor", budget_tokens=10_000, seed=1)
        streams = recorded(rt)
        logged_admissions(rt, streams)
        if not prefetch:
            rt.memory.prefetch = lambda work, reserve=0: 0
        root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
        a, b = rt.expand(root, 2, PARAMS)
        kv = rt.store.read(a.id)
        rt.store.apply(a.id, torch.tensor([0]), offload=True)  # branch a leaves the device but one token
        rt.expand(b, 1, PARAMS)
        mark = len(streams.log)
        rt.expand(a, 2, PARAMS)  # the search switches back to a
        log = streams.log[mark:]
        ((note, blocks, _),) = restore_batches(log)
        admitted = next(i for i, e in enumerate(log) if e[0] == "admit")
        assert blocks == [a.id] and (note < admitted) is prefetch
        assert all(torch.equal(x, y) for x, y in zip(rt.store.read(a.id), kv, strict=True))
        trees[prefetch] = [n.token_ids for n in rt.all_nodes.values()]
        rehydrated[prefetch] = rt.metrics.rehydrated_tokens
    assert trees[True] == trees[False] and rehydrated[True] == rehydrated[False] > 0


def test_no_prefetch_below_the_floor_or_without_free_room(tiny):
    """The planner's rule: a path that will be token-extracted (its thought does not fit the budget with
    it) or hosted tokens that do not fit the free slots now are left to the admission."""
    rt = Runtime(tiny, policy="arbor", budget_tokens=400)
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kid = rt.expand(root, 1, PARAMS)[0]
    rt.store.apply(kid.id, torch.tensor([0]), offload=True)
    planner, path = rt.memory.planner, root.length + kid.length
    assert planner.prefetches([(kid, 400 - path)], 4, reserve=0)
    assert not planner.prefetches([(kid, 400 - path + 1)], 4, reserve=0)  # below the floor: token-extracted
    assert not planner.prefetches([(kid, 5)], 4, reserve=planner.free - 3)  # not free now
    assert not Runtime(tiny, policy="h2o", budget_tokens=400).memory.planner.prefetches([(kid, 5)], 4, 0)
