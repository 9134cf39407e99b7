"""benchmarks/weights.py's answers table and benchmarks/step_overhead.py (issue 64), on small inputs."""

from __future__ import annotations

import json

import pytest

import benchmarks.step_overhead as step_overhead
from benchmarks.weights import answers, problem_rows


def run_dir(path, rows):
    path.mkdir()
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_answers_pair_two_runs_problem_by_problem(tmp_path):
    ref = run_dir(tmp_path / "fp32", [
        {"index": 0, "solved": True, "answer": "a", "seconds": 10.0},
        {"index": 1, "solved": False, "answer": "b", "seconds": 10.0},
        {"index": 2, "solved": True, "answer": "c", "seconds": 20.0},
    ])  # fmt: skip
    other = run_dir(tmp_path / "int4", [
        {"index": 0, "solved": True, "answer": "a", "seconds": 5.0, "weights": "int4"},
        {"index": 1, "solved": True, "answer": "z", "seconds": 5.0, "weights": "int4"},
        {"index": 2, "solved": False, "answer": "y", "seconds": 5.0, "weights": "int4", "oom": False},
        {"index": 3, "solved": True, "answer": "w", "seconds": 5.0, "weights": "int4"},
    ])  # fmt: skip
    row = answers("game24", ref, other)
    assert (row["problems"], row["solved_ref_n"], row["solved_n"]) == (3, 2, 2)  # problem 3: not in both
    assert (row["gained_n"], row["lost_n"], row["same_answer_n"], row["weights"]) == (1, 1, 1, "int4")
    assert row["x_seconds"] == 0.5
    rows = problem_rows(ref, other)  # what the section commits: every total above recounts from them
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert sum(r["solved"] for r in rows) == row["solved_n"] and sum(r["solved_ref"] for r in rows) == 2
    assert sum(r["answer"] == r["answer_ref"] for r in rows) == row["same_answer_n"]


def test_step_overhead_splits_each_step_into_model_and_own_time(capsys):
    args = ["--blocks", "30", "--rows", "1,4", "--policies", "full,arbor", "--tokens", "4", "--depth", "4"]
    assert step_overhead.main(args) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "blocks read" in line]
    assert len(lines) == 4 and all("own" in line and "model" in line for line in lines)


def test_step_clock_counts_only_steps_that_ran_the_model(tiny):
    from arbor_runtime import Runtime, SamplingParams

    rt = Runtime(tiny, policy="full")
    root = rt.new_tree_ids(list(range(3, 40)))
    with step_overhead.StepClock(rt) as clock:
        rt.expand(root, 2, SamplingParams(max_new_tokens=5, temperature=0.0, stop_at_eos=False))
    assert len(clock.steps) == 5  # one forward a token
    assert all(total >= model + sampled and model > 0 for total, model, sampled in clock.steps)
    assert pytest.approx(sum(m for _, m, _ in clock.steps)) == sum(clock.forwards)
    assert [sampled > 0 for _, _, sampled in clock.steps] == [True] * 4 + [False]  # the last step only ends rows
    assert pytest.approx(sum(s for _, _, s in clock.steps)) == sum(clock.samplings)


def test_events_the_policy_does_not_plan_on_build_no_block_view(tiny, monkeypatch):
    """A node's end leaves arbor nothing to plan: the view's blocks (one per live block:
    time in proportion to the whole tree) are not built for them, only for a memory threshold."""
    from arbor_runtime import Runtime, SamplingParams
    from arbor_runtime.memory import MemoryManager

    built = []
    real = MemoryManager._block_views
    monkeypatch.setattr(MemoryManager, "_block_views", lambda self, hosted: built.append(1) or real(self, hosted))
    rt = Runtime(tiny, policy="arbor", budget_tokens=4096)
    root = rt.new_tree_ids(list(range(3, 40)))
    kids = [rt.append_ids(root, [5, 6, 7, 8]) for _ in range(4)]
    rt.expand_many([(k, 1) for k in kids], SamplingParams(max_new_tokens=4, temperature=0.0, stop_at_eos=False))
    kinds = {r.kind for r in rt.memory.events.records}
    assert "node_end" in kinds and "memory_threshold" not in kinds, kinds
    assert built == []  # node ends only: nothing built
    rt.memory.compress(10)  # a threshold: the policy plans, and reads every block
    assert built == [1]


def test_the_committed_answers_table_recounts_from_its_rows():
    """Every row of the weights section's answers table (long-context rows aside) recounts from the
    per-problem rows committed beside it."""
    from benchmarks.results.data import DATA

    path = DATA / "weights" / "results.json"
    table = json.loads(path.read_text())["tables"].get("answers", {"rows": []}) if path.is_file() else {"rows": []}
    for row in table["rows"]:
        if row["x_seconds"] is None:  # a long-context row: its items are the suites' own rows files
            continue
        rows = [json.loads(x) for x in (DATA / "weights" / f"answers-{row['search']}.jsonl").read_text().splitlines()]
        assert len(rows) == row["problems"], row["search"]
        assert sum(r["solved"] for r in rows) == row["solved_n"]
        assert sum(r["solved_ref"] for r in rows) == row["solved_ref_n"]
        assert sum(r["solved"] and not r["solved_ref"] for r in rows) == row["gained_n"]
        assert sum(r["solved_ref"] and not r["solved"] for r in rows) == row["lost_n"]
        assert sum(r["answer"] == r["answer_ref"] and not r["oom"] for r in rows) == row["same_answer_n"]


def test_the_weights_sections_game24_search_decodes_nothing_as_its_notes_say():
    """docs/notes/weights.md says the Game of 24 search decodes nothing (why int4 is no faster there): every
    committed problem row, both formats, decoded no token."""
    from benchmarks.results.data import DATA, REPO

    notes = (REPO / "docs" / "notes" / "weights.md").read_text()
    path = DATA / "weights" / "answers-game24.jsonl"
    if "decodes nothing" in notes:
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        assert rows and all(r["decode_tokens"] == 0 and r["decode_tokens_ref"] == 0 for r in rows)
