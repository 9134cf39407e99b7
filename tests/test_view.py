"""The viewer's data: residency.jsonl (per-block deltas) and the pages arbor-view / view=true write.

One tiny-model run (tests/view_run.py) with an ArborKV budget small enough that blocks go to the
host tier; its pages must embed exactly the run's tree export, and its residency deltas must
replay to the trace's totals at every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from view_run import block_states, by_index, jsonl, tiny_view_run

from arbor_cli.residency import FIELDS, RESIDENCY_FILE, replay, totals
from arbor_cli.tree_export import load_tree
from arbor_cli.view import embedded_data, main, write_views
from arbor_cli.view.page import problem_page


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir, one_torch_thread) -> Path:
    return tiny_view_run(tmp_path_factory.getbasetemp(), data_dir)


def pages(run_dir: Path) -> dict[int, dict]:
    return {i: embedded_data((run_dir / "view" / f"{i}.html").read_text()) for i in (900, 901)}


def test_view_true_writes_the_pages_and_prints_the_index(run_dir):
    index = run_dir / "view" / "index.html"
    assert f"view: {index}" in (run_dir / "console.txt").read_text().replace("\n", "")
    text = index.read_text()
    assert '<a href="900.html">900</a>' in text and '<a href="901.html">901</a>' in text
    assert "http://" not in text and "https://" not in text  # nothing to fetch


def test_page_embeds_the_tree_export(run_dir):
    for index, page in pages(run_dir).items():
        export = load_tree(run_dir, index)
        assert page["tree"] == export
        got = [(n["id"], n["parent"], n["value"]) for n in page["tree"]["nodes"]]
        assert got == [(n["id"], n["parent"], n["value"]) for n in export["nodes"]] and len(got) > 20
        assert page["trace"] == by_index(run_dir / "traces.jsonl")[index]["trace"]
        assert page["events"] == by_index(run_dir / "events.jsonl")[index]["events"]


def test_residency_replays_to_the_trace_totals_at_every_step(run_dir):
    residency, traces = by_index(run_dir / RESIDENCY_FILE), by_index(run_dir / "traces.jsonl")
    assert sorted(residency) == [900, 901]
    hosted = 0
    for index, record in residency.items():
        assert pages(run_dir)[index]["residency"] == record
        trace = traces[index]["trace"]
        states = replay(record, [p["step"] for p in trace])
        assert [totals(s) for s in states] == [(p["resident_tokens"], p["host_tokens"]) for p in trace]
        hosted += sum(p["host_tokens"] > 0 for p in trace)
        final = states[-1]
        for node in load_tree(run_dir, index)["nodes"]:  # the end of the replay is the export's residency
            assert final[node["id"]] == (node["kv_device"], node["kv_host"], node["kv_dropped"]), node["id"]
    assert hosted > 10  # the budget did send blocks to the host tier


def test_residency_lines_are_deltas_with_their_step_and_cause(run_dir):
    events = by_index(run_dir / "events.jsonl")
    for index, record in by_index(run_dir / RESIDENCY_FILE).items():
        assert record["fields"] == list(FIELDS) and set(record) == {"index", "fields", "deltas", "event_steps"}
        seen, ops = set(), set()
        for step, node, device, host, dropped, op, cause in record["deltas"]:
            assert (device, host, dropped) != (0, 0, 0) or node not in seen or "release" in op
            seen.add(node)
            ops.update(op.split("+"))
            if cause >= 0:  # the event it names was logged in the same step
                assert record["event_steps"][cause] == step
        assert {"put", "evict", "rehydrate", "release"} <= ops
        evs = events[index]["events"]
        assert len(record["event_steps"]) == len(evs) and record["event_steps"] == sorted(record["event_steps"])
        first = {}
        for step, node, *_ in record["deltas"]:
            first.setdefault(node, step)
        for ev, step in zip(evs, record["event_steps"], strict=True):
            if ev["kind"] == "node_end":
                assert first[ev["node_id"]] <= step


def test_the_other_run_files_keep_their_format(run_dir):
    assert all(set(r) == {"index", "trace"} for r in jsonl(run_dir / "traces.jsonl"))
    assert all(set(r) == {"index", "events"} for r in jsonl(run_dir / "events.jsonl"))
    assert len(jsonl(run_dir / RESIDENCY_FILE)) == len(jsonl(run_dir / "results.jsonl")) == 2


def test_states_change_over_the_steps(run_dir):
    """The run shows what the slider is for: host-tier and shared blocks at some step, states that change."""
    page = pages(run_dir)[900]
    states = block_states(page["tree"], page["residency"], page["trace"])
    seen = {s for step in states for s in step.values()}
    assert {"future", "whole", "shared", "released"} <= seen and seen & {"host", "partial"}
    assert states[0] != states[-1]


def test_arbor_view_rewrites_a_run_dir(run_dir, capsys):
    (run_dir / "view" / "900.html").unlink()
    assert main([str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "view" / "index.html")
    assert embedded_data((run_dir / "view" / "900.html").read_text())["tree"] == load_tree(run_dir, 900)


def test_arbor_view_refuses_a_dir_without_results(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("arbor-view: error: ") and "nowhere" in err and "results.jsonl" in err


def test_a_problem_without_a_tree_gets_a_page(tmp_path):
    """An OOM row that never ran (no tree, no trace) and a run dir from before residency.jsonl existed."""
    row = {"index": 3, "question": "1 1 1 1", "solved": False, "oom": True, "budget_tokens": 10, "seconds": 0.0}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    index = write_views(tmp_path)
    page = embedded_data((tmp_path / "view" / "3.html").read_text())
    assert page["tree"] is None and page["residency"] is None and page["trace"] == []
    assert '<a href="3.html">3</a>' in index.read_text()


def test_embedded_json_cannot_end_its_script_element():
    page = {"index": 0, "question": "</script><!-- x", "row": {"answer": float("nan")}, "tree": None,
            "trace": [], "events": [], "residency": None, "event_steps": [], "budget": None}  # fmt: skip
    with pytest.raises(ValueError):  # NaN is not JSON: data.py writes None for it
        problem_page(page)
    page["row"]["answer"] = None
    text = problem_page(page)
    assert text.count("</script>") == 2 and embedded_data(text) == page


def test_a_shared_runtime_records_each_problem_its_own_tree(tmp_path_factory, data_dir, one_torch_thread):
    run_dir = tiny_view_run(tmp_path_factory.getbasetemp(), data_dir, "concurrency=2", name="view-run-shared")
    for index, record in by_index(run_dir / RESIDENCY_FILE).items():
        tree = load_tree(run_dir, index)
        ids = {n["id"] for n in tree["nodes"]}
        assert {d[1] for d in record["deltas"]} == ids
        trace = by_index(run_dir / "traces.jsonl")[index]["trace"]
        final = replay(record, [p["step"] for p in trace])[-1]
        assert all(final[n["id"]] == (n["kv_device"], n["kv_host"], n["kv_dropped"]) for n in tree["nodes"])
