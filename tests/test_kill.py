"""A real kill: `arbor-solve` SIGKILLed three times at random points, then resumed, records every problem
exactly once with the values an uninterrupted run records (issue 47).

Each configuration (local at concurrency 1 and 2, and runner=ray with one actor) runs the same 24
Game of 24 problems (sampled steps, arbor at a 600-token budget, so rows evict, rehydrate and sample)
in a run dir of its own: three runs are each killed (SIGKILL) by one of three triggers, in this order
(:data:`TRIGGERS`): after N more rows, mid-problem (a random moment after a row), and mid-write (as soon as
a problem's records start to land, before its results row); a fourth run finishes it. Its results
are compared, row by row, with those of an uninterrupted run at concurrency 1: answers, paths and
generated tokens everywhere; prompt tokens, peaks and the whole search tree where each problem has a
runtime of its own (concurrency 1 locally, and on Ray, whose actor searches one problem at a time).
After each kill of the Ray driver, every process it started must be gone within seconds (the reaper,
``arbor_cli/runners/reaper.py``). N and the moment come from ``ARBOR_KILL_SEED`` when set (a failure
names the seed it ran with); the order is fixed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbor_cli.results import EVENTS_FILE, RESULTS_FILE, TRACES_FILE

PROBLEMS = list(range(900, 924))
SEARCH = [
    "model=tiny-random", "task.propose=sample", "controller.n_generate=2", "controller.breadth=1",
    "policy=arbor", "policy.budget_tokens=600", "view=false",
]  # fmt: skip
#: row fields every run must reproduce whatever shares its runtime: answers, paths, generated tokens
SAME = (
    "index", "question", "answer", "solved", "best_path", "steps", "vote_answer", "vote_count", "vote_correct",
    "oom", "error", "decode_tokens", "nodes_created", "nodes_expanded", "generation_calls", "verifier_calls",
    "model_calls", "duplicates_dropped",
)  # fmt: skip
#: and, when each problem has a runtime of its own, its prompt tokens and memory peaks too
OWN_RUNTIME = (
    "prefill_tokens", "scored_tokens", "peak_device_tokens", "peak_device_bytes", "peak_host_tokens",
    "evicted_tokens", "dropped_tokens", "rehydrations", "rehydrated_tokens", "recomputed_tokens", "forward_calls",
)  # fmt: skip
#: tree node fields that depend on nothing but the problem (ids are per runtime, so only with one each)
TREE_FIELDS = ("id", "parent", "kind", "text", "tokens", "start_pos", "depth", "value", "stop_reason", "released")
SEED = int(os.environ.get("ARBOR_KILL_SEED", time.time_ns() % 10**9))
#: the kill points, in the order every run takes them. A mid-write kill leaves a problem's trace and events
#: without its results row; the rerun that follows must drop them (``clean_run_dir``). Were another kill
#: to follow it, that rerun's claim would dedupe the duplicates its problem wrote again, and a missing
#: drop would pass unseen (with a random order, it was caught about one run in three): so it comes last.
TRIGGERS = ("rows", "mid_problem", "mid_write")


def solve_cmd(data_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    where = [f"paths.data_dir={data_dir}", f"run_dir={run_dir}"]
    where += [f"task.start={PROBLEMS[0]}", f"task.end={PROBLEMS[-1] + 1}"]
    return [sys.executable, "-m", "arbor_cli.solve", *SEARCH, *where, *extra]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """The command as its own process (one torch thread: Ray gives its one-CPU actors the same)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def whole_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 120.0) -> None:
    """Poll every millisecond until ``ready()``; fail when the run ends (or time runs out) first."""
    end = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before the kill point ({what}); seed {SEED}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"no kill point ({what}) within {timeout} s; seed {SEED}")
        time.sleep(0.001)


def kill_at(proc: subprocess.Popen, run_dir: Path, trigger: str, rng: random.Random) -> str:
    """SIGKILL ``proc`` at a point ``trigger`` picks; returns what the point was."""
    results, traces = run_dir / RESULTS_FILE, run_dir / TRACES_FILE
    rows = whole_lines(results)
    if trigger == "rows":
        n = rng.randint(1, 4)
        wait_for(proc, lambda: whole_lines(results) >= rows + n, f"{n} more rows")
        what = f"after {n} more rows"
    elif trigger == "mid_problem":
        wait_for(proc, lambda: whole_lines(results) > rows, "a row")
        pause = rng.uniform(0.0, 0.3)
        time.sleep(pause)
        what = f"{pause:.3f} s after a row"
    else:
        before = size(traces)
        wait_for(proc, lambda: size(traces) > before, "a problem's records")
        what = "as a problem's records were written"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return what


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def command(pid: int) -> str:
    """A process's command line (for a failure message)."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def tree(run_dir: Path, index: int) -> list[dict]:
    nodes = json.loads((run_dir / "trees" / f"{index}.json").read_text())["nodes"]
    return [{k: n[k] for k in TREE_FIELDS} for n in nodes]


#: a driver that starts, under the reaper, a child that keeps the marker and a grandchild whose
#: environment is wiped (as a Ray agent's is by its process title), prints their pids and waits
DRIVER = """
import os, subprocess, sys, time
from arbor_cli.runners.reaper import reaped
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
with reaped():
    child = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; g = subprocess.Popen(%r, env={}); print(g.pid, flush=True); time.sleep(600)"
    ) % (sleeper,)], stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
time.sleep(1.5)  # the reaper looks every 0.5 s
print(child.pid, grandchild, flush=True)
time.sleep(600)
"""


def test_the_reaper_ends_what_a_killed_driver_started(tmp_path):
    """The mechanism alone: SIGKILL the driver; its marked child and that child's unmarked child end
    within seconds (Ray's agents outlived a killed driver by about a minute before it)."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in driver.stdout.readline().split()]
    try:
        assert len(pids) == 2 and all(alive(p) for p in pids)
        driver.kill()
        driver.wait()
        end = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.05)
        assert not [p for p in pids if alive(p)]
    finally:
        for pid in (p for p in pids if alive(p)):  # a failure leaves no sleeper behind
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def uncut(data_dir, tmp_path_factory) -> Path:
    """An uninterrupted run at concurrency 1, as a process like the killed ones."""
    run_dir = tmp_path_factory.mktemp("uncut")
    proc = start(solve_cmd(data_dir, run_dir), run_dir.parent / "uncut.log")
    assert proc.wait(timeout=300) == 0, (run_dir.parent / "uncut.log").read_text()[-3000:]
    return run_dir


@pytest.mark.parametrize(
    ("name", "extra", "own_runtime"),
    [("local-c1", [], True), ("local-c2", ["concurrency=2"], False), ("ray", ["runner=ray", "runner.actors=1"], True)],
)
def test_killed_three_times_and_resumed_equals_an_uncut_run(name, extra, own_runtime, uncut, data_dir, tmp_path):
    rng = random.Random(f"{SEED}-{name}")
    run_dir, log = tmp_path / "run", tmp_path / "solve.log"
    cmd = solve_cmd(data_dir, run_dir, *extra)
    kills = []
    for trigger in TRIGGERS:  # mid_write last: the final run alone must drop the orphaned records
        proc = start(cmd, log)
        started: set[int] = set()
        if name == "ray":  # the Ray processes this driver started, known once its first row is in
            wait_for(proc, lambda: whole_lines(run_dir / RESULTS_FILE) > len(kills), "the first row")
            started = descendants(proc.pid)
        kills.append(kill_at(proc, run_dir, trigger, rng))
        if started:  # the reaper ends them: none may outlive the driver by more than seconds
            end = time.monotonic() + 15
            while any(alive(p) for p in started) and time.monotonic() < end:
                time.sleep(0.1)
            left = {p: command(p) for p in sorted(started) if alive(p)}
            assert not left, f"Ray processes outlived the killed driver: {left}; seed {SEED}"
    assert start(cmd, log).wait(timeout=300) == 0, log.read_text()[-3000:]
    why = f"{name}, seed {SEED}, killed {kills}"
    for file in (RESULTS_FILE, EVENTS_FILE, TRACES_FILE):  # each problem exactly once in every file
        assert sorted(r["index"] for r in records(run_dir, file)) == PROBLEMS, f"{file}: {why}"
    fields = SAME + (OWN_RUNTIME if own_runtime else ())
    expected = {r["index"]: {k: r.get(k) for k in fields} for r in records(uncut, RESULTS_FILE)}
    got = {r["index"]: {k: r.get(k) for k in fields} for r in records(run_dir, RESULTS_FILE)}
    for index in PROBLEMS:
        assert got[index] == expected[index], f"problem {index}: {why}"
        if own_runtime:
            assert tree(run_dir, index) == tree(uncut, index), f"problem {index}'s tree: {why}"
    assert sum(r["decode_tokens"] for r in expected.values()) > 0  # the searches sampled
