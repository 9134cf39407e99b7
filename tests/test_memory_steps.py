"""benchmarks/memory_steps.py: the memory-over-steps section read from two real arbor-solve run dirs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from arbor_cli.build import compose_config
from arbor_cli.run import run
from benchmarks.memory_steps import collect, write
from benchmarks.results.data import load_section

#: one Game of 24 puzzle, ToT BFS with legal proposals, tiny model: ~140-token prompt, a tree of ~1K tokens
SEARCH = (
    "model=tiny-random", "task.start=900", "task.end=901", "task.propose=legal", "task.n_shots=1",
    "controller.n_generate=5", "controller.breadth=3", "verifier=game24_oracle",
)  # fmt: skip
BUDGET = 300


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory, data_dir, one_torch_thread) -> list[Path]:
    base = tmp_path_factory.mktemp("memory-steps")
    out = []
    for name, policy in (("full", ["policy=full"]), ("arbor", ["policy=arbor", f"policy.budget_tokens={BUDGET}"])):
        cfg = compose_config([*SEARCH, *policy, f"paths.data_dir={data_dir}", f"run_dir={base / name}"])
        assert run(cfg, console=Console(quiet=True)) == 0
        out.append(base / name)
    return out


def _trace(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "traces.jsonl").read_text().splitlines()[0])["trace"]


def test_rows_follow_the_runs_traces_and_events(run_dirs):
    rows, steps = collect(run_dirs)
    full, arbor = rows
    assert (full["policy"], full["budget"]) == ("full", "none")
    assert (arbor["policy"], arbor["budget"]) == (f"arbor@{BUDGET}", BUDGET)
    assert full["peak_device"] > BUDGET >= arbor["peak_device"]  # the budget binds, and holds
    assert arbor["peak_host"] > 0 and arbor["thresholds"] > 0 and full["thresholds"] == 0
    trace = _trace(run_dirs[1])
    mine = [s for s in steps if s["policy"] == arbor["policy"]]
    assert [s["device"] for s in mine] == [p["resident_tokens"] for p in trace]
    assert [s["host"] for s in mine] == [p["host_tokens"] for p in trace]
    assert sum(s["rehydrations"] for s in mine) == trace[-1]["rehydrations"] == arbor["rehydrations"]
    events = json.loads((run_dirs[1] / "events.jsonl").read_text().splitlines()[0])["events"]
    assert sum(s["switches"] for s in mine) == sum(e["kind"] == "branch_switch" for e in events)
    # arbor keeps the active path whole: the same tree as full
    assert (full["same_tree"], arbor["same_tree"]) == ("yes", "yes")


def test_a_different_tree_is_named(run_dirs, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run_dirs[1], other)
    tree_file = other / "trees" / "900.json"
    tree = json.loads(tree_file.read_text())
    tree["nodes"][-1]["text"] += " changed"
    tree_file.write_text(json.dumps(tree))
    rows, _ = collect([run_dirs[0], other])
    assert [r["same_tree"] for r in rows] == ["yes", "no"]


def test_the_section_file_renders_and_draws(run_dirs, tmp_path):
    pytest.importorskip("matplotlib")  # the sweep extra; CI installs it
    from benchmarks.results.plots import memory_steps
    from benchmarks.results.tables import render_table

    write(run_dirs, "arbor-solve ...", root=tmp_path)
    data = load_section("memory-steps", tmp_path)
    assert data["command"] == "arbor-solve ..." and data["commit"] is not None
    assert len(data["tables"]["steps"]["rows"]) == sum(len(_trace(d)) for d in run_dirs)
    assert f"| arbor@{BUDGET} | {BUDGET} |" in render_table(data["tables"]["main"])
    png = tmp_path / "memory-steps.png"
    memory_steps(data, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_dir_without_the_problem_is_refused(run_dirs):
    with pytest.raises(SystemExit, match="expected one line for problem 5"):
        collect(run_dirs, index=5)
