"""`make results` resumes (issue 27): a step done at the same runtime code is kept, an interrupted one
resumes with its outputs, one begun at other runtime code starts from empty outputs, and the wall
times of the steps add up into the make-results section's data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.results import steps
from benchmarks.results.data import load_section

REPO = Path(__file__).resolve().parents[1]


def test_a_step_done_at_this_code_is_kept_and_at_other_code_is_not(tmp_path):
    out = tmp_path / "out"
    assert steps.is_done(out, "a", "code1") is None
    assert steps.begin(out, "a", [], "code1") is False
    steps.end(out, "a", 12.0)
    assert steps.is_done(out, "a", "code1")["seconds"] == 12.0
    assert steps.is_done(out, "a", "code2") is None
    assert steps.is_done(out, "a", None) is None  # outside git nothing counts as done


def _interrupted_attempt(out: Path, work: Path) -> None:
    """Step `a` begun at runtime code `code1`, its outputs partly written, then stopped after 100 s."""
    steps.begin(out, "a", [work], "code1")
    work.mkdir()
    (work / "rows.jsonl").write_text("{}\n")
    steps.interrupted(out, "a", 100.0)


def test_an_interrupted_step_resumes_with_its_outputs_and_counts_all_its_time(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    _interrupted_attempt(out, work)
    assert steps.begin(out, "a", [work], "code1") is True  # same code: resume, outputs kept
    assert (work / "rows.jsonl").is_file()
    rec = steps.end(out, "a", 50.0)
    assert rec["seconds"] == 150.0 and rec["attempts"] == 2


def test_a_step_begun_at_other_code_starts_from_empty_outputs(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    _interrupted_attempt(out, work)
    assert steps.begin(out, "a", [work], "code2") is False
    assert not work.exists()
    rec = steps.end(out, "a", 5.0)
    assert rec["seconds"] == 5.0 and rec["attempts"] == 1 and rec["runtime"] == "code2"


def test_the_report_sums_the_steps_and_refuses_one_not_done(tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    for name, seconds in (("a", 600.0), ("b", 1800.0)):
        steps.begin(out, name, [], "code1")
        steps.end(out, name, seconds)
    steps.report(out, "quick", ["a", "b"], "code1", data_root=data)
    doc = load_section("make-results-quick", data)
    assert [r["minutes"] for r in doc["tables"]["main"]["rows"]] == [10.0, 30.0]
    assert doc["facts"]["total_minutes"] == 40.0 and doc["facts"]["total_hours"] == 0.67
    assert doc["command"].startswith("bash scripts/results_all.sh quick") and doc["settings"]["runtime_code"] == "code1"
    steps.begin(out, "c", [], "code1")
    with pytest.raises(SystemExit, match="'c' is not done"):
        steps.report(out, "quick", ["a", "c"], "code1", data_root=data)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_runtime_code_follows_the_runtime_and_not_the_docs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "arbor_runtime").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "arbor_runtime" / "x.py").write_text("A = 1\n")
    (repo / "docs" / "page.md").write_text("page\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = steps.runtime_code(repo)
    (repo / "docs" / "page.md").write_text("another page\n")
    assert steps.runtime_code(repo) == first
    (repo / "arbor_runtime" / "x.py").write_text("A = 2\n")  # uncommitted runtime changes count
    changed = steps.runtime_code(repo)
    assert changed != first
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    assert steps.runtime_code(repo) not in (first, None)


STEP_SCRIPT = """
source scripts/results_steps.sh
step a "$OUT/a" -- bash -c 'mkdir -p "$OUT/a"; echo ran >> "$OUT/runs-a"'
step b "$OUT/b" -- bash -c 'mkdir -p "$OUT/b"; echo ran >> "$OUT/runs-b"; [ -e "$OUT/b-may-pass" ]'
touch "$OUT/reached-the-end"
"""


def _run_steps(out: Path) -> subprocess.CompletedProcess:
    env = {"OUT": str(out), "PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", STEP_SCRIPT], cwd=REPO, env=env, text=True,
                          capture_output=True)  # fmt: skip


def test_results_steps_sh_skips_done_steps_and_resumes_a_failed_one(tmp_path):
    """scripts/results_steps.sh as results_all.sh sources it: the first run does `a`, fails in `b` (the
    script stops there); the second keeps `a` without running it again and reruns `b` with its
    outputs, which now passes."""
    out = tmp_path / "out"
    first = _run_steps(out)
    assert first.returncode != 0 and not (out / "reached-the-end").exists()
    assert json.loads((out / "steps" / "b.json").read_text())["status"] == "started"
    (out / "b-may-pass").touch()
    second = _run_steps(out)
    assert second.returncode == 0, second.stderr
    assert "== a: done" in second.stdout and "== b: resuming" in second.stdout
    assert (out / "runs-a").read_text() == "ran\n"
    assert (out / "runs-b").read_text() == "ran\nran\n"
    assert json.loads((out / "steps" / "b.json").read_text())["attempts"] == 2


def test_results_all_parses_and_refuses_a_bad_size_before_any_step(tmp_path):
    assert subprocess.run(["bash", "-n", "scripts/results_all.sh"], cwd=REPO).returncode == 0
    env = {"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", "scripts/results_all.sh", "huge", str(tmp_path), "no-python"], cwd=REPO,
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip() == "results_all.sh: error: SIZE=huge; valid: quick, full"
    assert not (tmp_path / "out").exists()


ONLY_SCRIPT = """
source scripts/results_steps.sh
check_only "$0" "$@"
for name in wide kvp-collect kvp-train-listnet kvp-data sparse; do
  step "$name" -- bash -c "echo $name >> '$OUT/ran'"
done
report_steps full
"""


def _run_only(tmp_path: Path, only: str) -> subprocess.CompletedProcess:
    script = tmp_path / "steps.sh"
    script.write_text(ONLY_SCRIPT)
    env = {"OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "ONLY": only}
    return subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=REPO, env=env, text=True,
                          capture_output=True)  # fmt: skip


def test_only_runs_the_named_steps_and_their_group_and_reports_no_total(tmp_path):
    done = _run_only(tmp_path, "kvp,sparse")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert (out / "ran").read_text().split() == ["kvp-collect", "kvp-train-listnet", "kvp-data", "sparse"]
    assert "the wall-time total needs a sitting without ONLY" in done.stdout
    assert not (out / "steps" / "wide.json").exists()  # left for another sitting: not begun
    assert json.loads((out / "steps" / "sparse.json").read_text())["status"] == "done"


def test_only_naming_no_step_fails_before_any_step_runs(tmp_path):
    done = _run_only(tmp_path, "wide,kvpp")
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert done.stderr.strip() == ("results_all.sh: error: ONLY=wide,kvpp: no step named kvpp (or NAME-...); "
                                   "the steps: wide kvp-collect kvp-train-listnet kvp-data sparse")  # fmt: skip


def _grid_part(out: Path, step: str) -> None:
    """A finished step of the GSM8K concurrency grid: its JSONL and its record, done at this code."""
    part = out / "concurrency" / step.removeprefix("concurrency-")
    part.mkdir(parents=True)
    row = {"policy": "policy=full", "concurrency": 1, "peak_device_tokens_sum": 400, "step": step}
    (part / "concurrency.jsonl").write_text(json.dumps(row) + "\n")
    steps.begin(out, step, [], steps.runtime_code())
    steps.end(out, step, 1.0)


def test_only_one_step_of_the_concurrency_grid_leaves_its_join_for_the_sitting_with_all_three(tmp_path):
    """ONLY naming one step of a concurrency grid runs the grid's shared work (full's peaks size
    arbor's budgets) but joins the three searches' JSONL only once all three exist."""
    out = tmp_path / "out"
    grid = "concurrency-gsm8k-0-7"
    _grid_part(out, f"{grid}-full")

    def sitting(only: str) -> subprocess.CompletedProcess:
        env = {"OUT": str(out), "PATH": "/usr/bin:/bin", "ONLY": only}
        return subprocess.run(["bash", "scripts/results_all.sh", "full", str(tmp_path), sys.executable],
                              cwd=REPO, env=env, capture_output=True, text=True)  # fmt: skip

    first = sitting(f"{grid}-full")
    assert first.returncode == 0, first.stderr
    assert "not joined yet, waiting for" in first.stdout and "gsm8k-0-7-arbor/concurrency.jsonl" in first.stdout
    assert not (out / "concurrency-final").exists()
    _grid_part(out, f"{grid}-arbor")
    _grid_part(out, f"{grid}-noshare")
    second = sitting(grid)
    assert second.returncode == 0, second.stderr
    joined = (out / "concurrency-final" / "gsm8k-0-7" / "concurrency.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in joined] == [f"{grid}-{s}" for s in ("full", "arbor", "noshare")]


def test_results_all_lists_its_full_steps_without_running_or_writing_anything(tmp_path):
    env = {"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin", "LIST_STEPS": "1", "RESTART": "1"}
    done = subprocess.run(["bash", "scripts/results_all.sh", "full", str(tmp_path), sys.executable], cwd=REPO,
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = [line.removeprefix("step: ") for line in done.stdout.splitlines() if line.startswith("step: ")]
    assert names[0] == "accuracy" and len(names) == len(set(names)) > 30
    assert {"wide", "kvp-collect", "concurrency-gsm8k-0-7-arbor", "e2e-configl-game24"} <= set(names)
    assert not (tmp_path / "out").exists()


def test_wall_hours_counts_steps_run_side_by_side_once():
    """Two steps whose spans overlap take the clock time of their union; a step recorded before spans
    were kept counts its seconds up to when it finished."""
    t = "2026-12-04T{}:00+00:00"
    recs = [
        {"spans": [[t.format("10:00"), t.format("11:00")]], "seconds": 3600, "finished": t.format("11:00")},
        {"spans": [[t.format("10:30"), t.format("11:30")]], "seconds": 3600, "finished": t.format("11:30")},
        {"seconds": 1800, "finished": t.format("13:00")},  # no spans: 12:30-13:00
        {"spans": [[t.format("12:45"), None]], "seconds": 60, "finished": t.format("12:46")},  # open: its fallback
    ]
    assert steps.wall_hours(recs) == 2.0  # 10:00-11:30 and 12:30-13:00
    assert steps.wall_hours(recs[:1]) == 1.0


def test_an_attempt_records_its_span(tmp_path):
    out = tmp_path / "out"
    steps.begin(out, "a", [], "code1")
    steps.interrupted(out, "a", 5)
    steps.begin(out, "a", [], "code1")
    rec = steps.end(out, "a", 7)
    assert len(rec["spans"]) == 2 and all(a <= b for a, b in rec["spans"]) and rec["seconds"] == 12


def test_status_says_where_each_step_stands_and_what_is_left(tmp_path):
    out = tmp_path / "out"
    steps.begin(out, "a", [], "code1")
    steps.end(out, "a", 120)
    steps.begin(out, "b", [], "code1")
    steps.begin(out, "c", [], "code0")
    steps.end(out, "c", 60)
    lines = steps.status(out, ["a", "b", "c", "d"], "code1")
    assert lines[0].split()[:5] == ["a", "done", "in", "2.0", "min,"]
    assert "not finished" in lines[1] and "at other runtime code code0: starts over" in lines[2]
    assert lines[3].split()[1:] == ["not", "begun"]
    assert lines[4] == "runtime code code1: 1 of 4 steps done (2 min); left: b c d"
