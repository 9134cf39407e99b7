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
