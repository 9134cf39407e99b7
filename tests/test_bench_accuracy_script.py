"""scripts/bench_accuracy.sh schedules its runs (issue 27's accuracy step): JOBS=N runs N side by side,
every budgeted run after the `full` run its budget is read from, each with one torch thread; a failed
run stops the script before it writes the section; a bad JOBS is refused before any run. A stand-in
arbor-solve records each call, so no model is loaded."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_accuracy.sh"

#: a stand-in arbor-solve: one line per call (start, threads, args, end); fails on a run dir named in FAIL
FAKE_SOLVE = """#!/usr/bin/env bash
echo "start $*" >> "$LOG"
sleep 0.2
echo "end threads=${OMP_NUM_THREADS:-unset} $*" >> "$LOG"
case " $* " in *"run_dir=${FAIL:-none} "*) exit 3 ;; esac
"""


def _bin(tmp_path: Path) -> Path:
    b = tmp_path / "bin"
    b.mkdir()
    solve = b / "arbor-solve"
    solve.write_text(FAKE_SOLVE)
    solve.chmod(solve.stat().st_mode | stat.S_IXUSR)
    return b


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    log = tmp_path / "log"
    full_env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "JOBS")}
    full_env.update(
        BIN=str(_bin(tmp_path)),
        PYTHON="echo",
        LOG=str(log),
        MODES="io tot_legal",
        POLICIES="arbor h2o",
        RATIOS="0.5 0.25",
        **env,
    )
    p = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), "DATA", "900", "902"],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p, log.read_text().splitlines() if log.exists() else []


def _run_dir(line: str) -> str:
    return next(a for a in line.split() if a.startswith("run_dir=")).split("/out/", 1)[1]


def test_jobs_2_runs_every_run_once_each_budget_after_its_reference(tmp_path):
    p, log = _run(tmp_path, JOBS="2")
    assert p.returncode == 0, p.stderr
    ends = [ln for ln in log if ln.startswith("end ")]
    dirs = [_run_dir(ln) for ln in ends]
    expected = {"io/full", "tot_legal/full", "oracle/full"} | {
        f"{m}/{pol}-{r}" for m in ("io", "tot_legal") for pol in ("arbor", "h2o") for r in ("0.5", "0.25")
    }
    assert sorted(dirs) == sorted(expected)  # each once
    assert all("threads=1" in ln for ln in ends)
    for ln in log:  # a budgeted run starts only after its mode's full run ended
        d = _run_dir(ln)
        if ln.startswith("start ") and not d.endswith("/full"):
            mode = d.split("/")[0]
            assert log.index(ln) > log.index(next(e for e in ends if _run_dir(e) == f"{mode}/full"))
    starts = [ln for ln in log if ln.startswith("start ")]
    assert (
        max(
            sum(1 for ln in log[: log.index(s)] if ln.startswith("start "))
            - sum(1 for ln in log[: log.index(s)] if ln.startswith("end "))
            for s in starts
        )
        <= 1
    )  # <= 2 at once
    assert "JOBS=2 bash scripts/bench_accuracy.sh" in p.stdout  # the section records how it ran


def test_jobs_1_keeps_the_callers_threads_and_runs_one_at_a_time(tmp_path):
    p, log = _run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert all("threads=unset" in ln for ln in log if ln.startswith("end "))
    assert all(a.startswith("start") == (i % 2 == 0) for i, a in enumerate(log))  # start, end, start, end...
    assert "JOBS=" not in p.stdout


def test_a_failed_run_stops_the_script_before_the_section_is_written(tmp_path):
    p, log = _run(tmp_path, JOBS="2", FAIL=str(tmp_path / "out" / "tot_legal" / "h2o-0.5"))
    assert p.returncode != 0
    assert "benchmarks.results.accuracy" not in p.stdout
    assert any(_run_dir(ln) == "tot_legal/h2o-0.5" for ln in log)


def test_a_bad_jobs_is_refused_before_any_run(tmp_path):
    p, log = _run(tmp_path, JOBS="two")
    assert p.returncode == 2 and log == []
    assert p.stderr.strip() == "bench_accuracy.sh: error: JOBS=two: expected a whole number >= 1 (runs side by side)"
