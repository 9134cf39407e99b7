"""``Runtime.compress``: one memory-threshold plan to a target now, logged, replayable."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import Runtime
from arbor_runtime.events import MemoryThreshold
from benchmarks.replay import ReplayRun, replay_lockstep
from benchmarks.trace import record_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 5000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_compress_is_one_memory_threshold_that_brings_resident_kv_to_the_target(tiny):
    rt = Runtime(tiny, policy="streaming")
    root = rt.new_tree_ids(random_ids(100, seed=8))
    assert rt.compress(40) == 40 == rt.store.resident_tokens
    assert rt.store.get(root.id).kept.tolist() == [0, 1, 2, 3, *range(64, 100)]
    last = rt.events.records[-1]
    assert last.kind == MemoryThreshold.kind and last.data["needed"] == 60 and last.resident_tokens == 40
    assert rt.oplog[-1] == {"op": "compress", "target": 40}
    assert rt.metrics.dropped_tokens == 60 and rt.metrics.trace[-1].op == "compress"
    events = len(rt.events.records)
    assert rt.compress(50) == 40 and len(rt.events.records) == events  # already below: nothing to do


def test_compress_under_full_keeps_everything_and_bad_targets_are_refused(tiny):
    rt = Runtime(tiny, policy="full")
    rt.new_tree_ids(random_ids(30, seed=9))
    assert rt.compress(10) == 30
    for bad in (-1, 2.5, True, "10"):
        with pytest.raises(ValueError, match=f"target_tokens={bad!r} must be a non-negative number of tokens"):
            rt.compress(bad)


def test_a_compressed_trace_replays_with_the_same_compression(tiny):
    def search(rt):
        root = rt.new_tree("Use numbers and basic arithmetic operations (+ - * /) to obtain 24. " * 3)
        assert root.length > 30
        rt.compress(30)
        rt.append_ids(root, [7, 8, 9])

    trace = record_trace(tiny, search, meta={"task": "synthetic"})
    assert [op.op for op in trace.replay_ops()] == ["new_tree", "compress", "append"]
    run = ReplayRun("streaming")
    replay_lockstep(tiny, trace, [run])
    assert run.error is None and [s["op"] for s in run.steps] == ["new_tree", "compress", "append"]
    assert run.steps[1]["resident_tokens"] == 30 and run.fidelity.positions == 3
