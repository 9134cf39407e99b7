"""Trace record and replay: JSON round trip, exact replay under full, fidelity under budgets, OOMs, CLI."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from fixtures.synthetic import synthetic_search
from floats import reassociation_tol

from arbor_runtime import SamplingParams
from arbor_runtime.tree import FORCED, GENERATED
from benchmarks.cli import record_main, replay_main
from benchmarks.replay import ReplayRun, budgets_for, replay_lockstep, replay_trace
from benchmarks.trace import Trace, load_trace, record_trace

#: arbor completes the synthetic tiny trace at this share of the full peak (its active path fits)
LOW = 0.6


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.exactness]


@pytest.fixture(scope="module")
def trace(tiny) -> Trace:
    return record_trace(tiny, synthetic_search, meta={"task": "synthetic"})


def recorded_logprobs(trace: Trace) -> list[float]:
    return [x for n in trace.nodes.values() for x in n.logprobs]


def test_trace_is_json_and_round_trips(trace, tmp_path):
    path = trace.save(tmp_path / "t.json")
    data = json.loads(path.read_text())  # plain JSON, no pickle
    assert {"model", "oplog", "nodes", "expansions", "events", "memory", "metrics", "meta"} <= data.keys()
    again = load_trace(path)
    assert again.to_dict() == trace.to_dict()
    ops = [op["op"] for op in trace.oplog]
    assert {"new_tree", "expand", "append", "release", "set_value"} <= set(ops)
    assert any(len(op["requests"]) > 1 for op in trace.oplog if op["op"] == "expand")  # one expand, two parents
    assert trace.prompt_ids == trace.oplog[0]["ids"] and trace.prompt_text
    kinds = {n.kind for n in trace.nodes.values()}
    assert {GENERATED, FORCED} <= kinds
    assert all(len(n.logprobs) == len(n.token_ids) for n in trace.nodes.values() if n.parent is not None)
    assert trace.expansions and trace.events and trace.memory


def test_full_replay_reproduces_recorded_logprobs(tiny, trace):
    run = replay_trace(tiny, trace, "full")
    fid = run.fidelity
    assert not run.oom
    assert fid.positions == trace.scored_positions
    # the recording sampled them in batched decode, the replay teacher-forces each block in one
    # prefill: the same math summed in another order, so equal up to rounding (or exactly)
    assert fid.recorded_max_abs_diff <= reassociation_tol(tiny, recorded_logprobs(trace))
    assert run.metrics["peak_device_tokens"] == trace.full_replay_peak()
    assert run.metrics["prefill_tokens"] == trace.total_tokens  # every block once


def test_a_replay_that_differs_from_the_recording_is_caught(tiny, trace):
    """The comparison is with the recorded log-probs (not with a second replay of the same code): one
    recorded log-prob moved by 1e-3 shows up, and the reference is never scored against itself."""
    moved = Trace.from_dict(trace.to_dict())
    node = next(n for n in moved.nodes.values() if n.kind == GENERATED)
    node.logprobs[0] += 1e-3
    ref, run = replay_lockstep(tiny, moved, [ReplayRun("full")])
    tol = reassociation_tol(tiny, recorded_logprobs(trace))
    assert tol < 1e-3 / 2
    for fid in (ref.fidelity, run.fidelity):
        assert fid.recorded_max_abs_diff >= 1e-3 - tol and fid.positions == trace.scored_positions
    assert ref.fidelity.to_dict()["max_kl"] is None and ref.fidelity.to_dict()["top1_agreement"] is None


def test_full_replay_of_a_greedy_search_regenerates_its_tokens(tiny):
    """Under full the replay is exact: at every generated position of a greedy recording its
    greedy choice is the recorded token, and every recorded log-prob is reproduced up to rounding."""
    greedy = record_trace(tiny, lambda rt: synthetic_search(rt, temperature=0.0))
    run = ReplayRun("full")
    run.start(tiny)
    checked = 0
    tol = reassociation_tol(tiny, recorded_logprobs(greedy))
    for op in greedy.replay_ops():
        logp = run.apply(op, greedy)  # (T, V) for the T tokens of the block the op made, else None
        if logp is None:
            continue
        rec = greedy.nodes[op.child]
        mine = logp.gather(-1, torch.tensor(rec.token_ids).view(-1, 1)).squeeze(-1).double()
        assert float((mine - torch.tensor(rec.logprobs, dtype=torch.float64)).abs().max()) <= tol
        if rec.kind == GENERATED:
            assert logp.argmax(-1).tolist() == rec.token_ids
            checked += len(rec.token_ids)
    assert checked >= 8 * 8  # eight expansions of up to 8 tokens, two rows each


def test_full_replay_rebuilds_the_same_tree(tiny, trace):
    run = ReplayRun("full")
    run.start(tiny)
    for op in trace.replay_ops():
        run.apply(op, trace)
    for rec_id, node in run.nodes.items():
        rec = trace.nodes[rec_id]
        assert node.token_ids == rec.token_ids and node.start_pos == rec.start_pos
        parent = None if rec.parent is None else run.nodes[rec.parent]
        assert node.parent is parent
        assert node.released == rec.released and node.value == rec.value


def test_full_replay_matches_recorded_logprobs_on_smollm2(smollm2):
    params = SamplingParams(max_new_tokens=5, temperature=1.0)

    def search(rt):
        root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
        kids = rt.expand(root, 2, params)
        rt.append(kids[0], " (left: 4 8)\n")
        rt.expand_many([(kids[1], 1), (kids[0], 1)], params)

    trace = record_trace(smollm2, search)
    run = replay_trace(smollm2, trace, "full")
    assert run.fidelity.positions == trace.scored_positions
    assert run.fidelity.recorded_max_abs_diff <= reassociation_tol(smollm2, recorded_logprobs(trace))


def test_arbor_is_exact_at_a_low_budget_while_linear_policies_are_not(tiny, trace):
    budget = budgets_for(trace, [LOW])[LOW]
    assert budget < trace.full_replay_peak()
    ref, arbor, h2o, streaming = replay_lockstep(
        tiny, trace, [ReplayRun(name, budget, LOW) for name in ("arbor", "h2o", "streaming")]
    )
    assert not arbor.oom and arbor.metrics["rehydrations"] > 0 and arbor.metrics["evicted_tokens"] > 0
    assert arbor.metrics["peak_device_tokens"] <= budget
    assert arbor.fidelity.positions == trace.scored_positions
    # the active path is whole and rehydrated bit-identical, so arbor computes what full computes
    # over the same KV; how the blocks are laid out and merged may change the summation order, so
    # every log-prob equals full's up to rounding, and the top-1 token everywhere
    fid = arbor.fidelity
    assert fid.top1_agree == fid.positions
    assert fid.max_abs_dlogp <= reassociation_tol(tiny, [fid.scale])
    for run in (h2o, streaming):
        assert not run.oom and run.metrics["dropped_tokens"] > 0
        assert run.fidelity.kl_max > 1e-3 and run.fidelity.top1_agree < run.fidelity.positions
        assert run.fidelity.max_abs_dlogp > 100 * reassociation_tol(tiny, [run.fidelity.scale])  # not rounding
    # the reference is compared with the recording only (never with itself)
    assert ref.fidelity.recorded_max_abs_diff <= reassociation_tol(tiny, recorded_logprobs(trace))
    assert ref.fidelity.to_dict()["max_kl"] is None and ref.fidelity.positions == trace.scored_positions


def longest_path_tokens(trace: Trace) -> int:
    """Tokens on the longest root-to-node path of the trace (what a replayed append needs alone)."""

    def path(node_id):
        node = trace.nodes[node_id]
        return len(node.token_ids) + (0 if node.parent is None else path(node.parent))

    return max(path(i) for i in trace.nodes)


def test_arbor_completes_exactly_at_any_budget_that_holds_the_longest_path(tiny, trace):
    need = longest_path_tokens(trace)
    assert need < 0.6 * trace.full_replay_peak()  # a budget well below what full needs
    runs = replay_lockstep(tiny, trace, [ReplayRun("arbor", b) for b in (need - 1, need, need + 7)])
    below = runs[1]  # one token short: the longest path alone cannot fit, the path is token-extracted
    assert not below.oom and below.fidelity.positions == trace.scored_positions
    assert below.fidelity.kl_max > 1e-6 and below.metrics["peak_device_tokens"] <= below.budget_tokens
    (_, strict) = replay_lockstep(tiny, trace, [ReplayRun("arbor", need - 1, policy_kwargs={"degrade": False})])
    assert strict.oom  # the paper's all-or-nothing arbor stops there
    for run in runs[2:]:
        assert not run.oom and run.metrics["peak_device_tokens"] <= run.budget_tokens
        assert run.fidelity.positions == trace.scored_positions
        assert run.fidelity.top1_agree == run.fidelity.positions and run.fidelity.kl_max < 1e-6


def test_oom_is_recorded_not_raised(tiny, trace):
    budget = budgets_for(trace, [LOW])[LOW]
    tiny_budget = len(trace.prompt_ids) - 1  # the root prompt itself does not fit
    strict = ReplayRun("arbor", tiny_budget, policy_kwargs={"degrade": False})  # all-or-nothing
    _, full, arbor = replay_lockstep(tiny, trace, [ReplayRun("full", budget), strict])
    assert full.oom and "budget" in full.error and full.steps[-1]["oom"]
    assert full.metrics["peak_device_tokens"] <= budget
    assert 0 < full.fidelity.positions < trace.scored_positions  # scored up to the OOM
    assert arbor.oom and len(arbor.steps) == 1 and arbor.row()["oom"]


def test_replay_refuses_a_trace_from_another_tokenizer(tiny, trace):
    other = Trace.from_dict(trace.to_dict())
    other.nodes[other.roots[0].id].text += " extra words"
    with pytest.raises(ValueError, match="another tokenizer"):
        replay_trace(tiny, other, "full")


def test_unknown_trace_version_is_rejected(trace, tmp_path):
    data = trace.to_dict() | {"version": 99}
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="version 99"):
        load_trace(tmp_path / "t.json")


def test_record_and_replay_scripts_end_to_end(tiny, data_dir, tmp_path):
    overrides = ["model=tiny-random", f"paths.data_dir={data_dir}", "task.end=901", "task.n_shots=1"]
    assert record_main(["--out", str(tmp_path / "traces"), *overrides, "controller.n_generate=2"]) == 0
    path = tmp_path / "traces" / "game24-900.json"
    trace = load_trace(path)
    assert trace.meta["index"] == 900 and trace.meta["controller"] == "BFSController"
    argv = [str(path), "--policies", "full,arbor", "--fractions", "0.5,0.9", "--out", str(tmp_path / "replay")]
    assert replay_main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "replay" / "replay.jsonl").read_text().splitlines()]
    assert [(r["policy"], r["budget_fraction"]) for r in rows] == [
        ("full", 1.0), ("full", 0.5), ("full", 0.9), ("arbor", 0.5), ("arbor", 0.9)
    ]  # fmt: skip
    recorded = [x for n in trace.nodes.values() for x in n.logprobs]
    assert rows[0]["recorded_max_abs_diff"] <= reassociation_tol(tiny, recorded) and rows[0]["steps"]
    with (tmp_path / "replay" / "replay.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 5 and {"top1_agreement", "mean_kl", "peak_host_bytes", "oom"} <= table[0].keys()
    assert replay_main([str(path), "--policies", "nope"]) == 2


def test_a_replay_loads_the_weight_format_its_trace_was_recorded_with(tiny, trace, tmp_path, monkeypatch):
    """A trace records the weight format its search ran with (arbor-solve's default on CPU is int4 for a
    GGUF model, while load_model's own default is dense): the replay loads that format, a trace that does not
    say replays dense (what traces were before), and --weights chooses another."""
    import benchmarks.cli as cli

    assert trace.meta["weights"] == tiny.weights == "dense"
    asked = []

    def fake_load(spec, device=None, dtype=None, weights="dense"):
        asked.append(weights)
        return tiny

    monkeypatch.setattr(cli, "load_model", fake_load)
    monkeypatch.setattr(cli, "_MODELS", {})
    for weights, extra in (("int8", []), (None, []), ("int4", ["--weights", "dense"])):
        cli._MODELS.clear()  # one load per format and run
        trace.meta.pop("weights", None)
        if weights is not None:
            trace.meta["weights"] = weights
        path = trace.save(tmp_path / f"t-{weights}.json")
        out = tmp_path / f"replay-{weights}"
        assert cli.replay_main([str(path), "--policies", "full", "--fractions", "0.5", "--out", str(out), *extra]) == 0
    assert asked == ["int8", "dense", "dense"]
