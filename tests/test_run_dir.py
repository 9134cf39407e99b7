"""Run directories: one writer at a time (a lock naming its holder's pid, gone with its process),
the data file's identity in the resume fingerprint, and results.csv current while rows come in.

Every run goes through ``arbor_cli.run.run`` on the tiny model with the exact solver as verifier
(no value prompts: fast searches), as ``arbor-solve`` runs it.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

import arbor_cli.run as run_module
from arbor_cli.build import compose_config
from arbor_cli.results import CSV_FILE, EVENTS_FILE, RESULTS_FILE, TRACES_FILE, read_jsonl
from arbor_cli.resume import FINGERPRINT_FILE, LOCK_FILE, RunDirBusy, RunDirLock
from arbor_cli.run import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cfg(data_dir, run_dir, start=900, end=903, *extra):
    base = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={run_dir}", "controller.n_generate=2"]
    slice_ = [f"task.start={start}", f"task.end={end}"]
    return compose_config([*base, "controller.breadth=1", "verifier=game24_oracle", *slice_, *extra])


def indices(run_dir: Path, name: str = RESULTS_FILE) -> list[int]:
    return [r["index"] for r in read_jsonl(run_dir / name)]


def csv_indices(run_dir: Path) -> list[int]:
    with (run_dir / CSV_FILE).open(newline="", encoding="utf-8") as fh:
        return [int(row["index"]) for row in csv.DictReader(fh)]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("arbor-solve: error: ") and "\n" not in err, err
    return err


# ---- one writer at a time --------------------------------------------------------------------
def test_a_second_run_in_a_dir_in_use_gets_one_line_naming_the_pid(data_dir, tmp_path, capsys):
    with RunDirLock(tmp_path):  # another run writing there (here: this process, through its own lock)
        assert run(cfg(data_dir, tmp_path)) == 2
        err = one_error_line(capsys)
        assert f"run dir {tmp_path} is in use by pid {os.getpid()}" in err
        assert not (tmp_path / RESULTS_FILE).exists() and not (tmp_path / FINGERPRINT_FILE).exists()
    assert run(cfg(data_dir, tmp_path), Console(width=120)) == 0  # released: the next run goes ahead
    assert indices(tmp_path) == [900, 901, 902]


def test_the_lock_is_held_while_rows_are_written_and_released_after(data_dir, tmp_path, monkeypatch):
    seen = []
    write = run_module.write_finished

    def write_and_probe(run_dir, finished):
        with pytest.raises(RunDirBusy, match=f"in use by pid {os.getpid()}"):
            RunDirLock(run_dir).acquire()
        seen.append(finished.index)
        write(run_dir, finished)

    monkeypatch.setattr(run_module, "write_finished", write_and_probe)
    assert run(cfg(data_dir, tmp_path), Console(width=120)) == 0
    assert sorted(seen) == [900, 901, 902]
    RunDirLock(tmp_path).acquire().release()  # free again


def test_two_runs_in_one_dir_run_each_problem_once(data_dir, tmp_path, capsys, monkeypatch):
    """A second run started while the first writes (it holds the lock from inside its search) is
    refused; the dir ends with each problem once (before: both ran everything, 2x the rows)."""
    second = []
    write = run_module.write_finished

    def write_and_start_another(run_dir, finished):
        if not second:
            second.append(run(cfg(data_dir, tmp_path)))
        write(run_dir, finished)

    monkeypatch.setattr(run_module, "write_finished", write_and_start_another)
    assert run(cfg(data_dir, tmp_path), Console(width=120)) == 0
    assert second == [2] and "is in use by pid" in capsys.readouterr().err
    for name in (RESULTS_FILE, EVENTS_FILE, TRACES_FILE):
        assert indices(tmp_path, name) == [900, 901, 902], name


HOLD = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\\n".encode())
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_a_lock_held_by_another_process_refuses_and_its_death_frees_the_dir(data_dir, tmp_path, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / LOCK_FILE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run(cfg(data_dir, tmp_path)) == 2
        assert f"is in use by pid {holder.pid} " in one_error_line(capsys)
    finally:
        holder.send_signal(signal.SIGKILL)  # killed: its lock goes with it, its pid stays in the file
        holder.wait(timeout=60)
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(holder.pid)  # a stale lock file ...
    assert run(cfg(data_dir, tmp_path), Console(width=120)) == 0  # ... does not block
    assert indices(tmp_path) == [900, 901, 902]
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())


# ---- the data file is part of the fingerprint ------------------------------------------------
def copy_data(data_dir: Path, to: Path, edit=None) -> Path:
    """A copy of the data folder; ``edit`` rewrites the Game of 24 file's lines."""
    shutil.copytree(data_dir, to)
    path = to / "game24" / "24.csv"
    if edit is not None:
        lines = path.read_bytes().decode().splitlines(keepends=True)  # its own line ends kept (CSV: CRLF)
        path.write_bytes("".join(edit(lines)).encode())
    return to


def swap_puzzles(lines: list[str], a: int, b: int) -> list[str]:
    """Swap the puzzles of data rows ``a`` and ``b`` (line 0 is the header): same size, other rows."""
    rows = [line.split(",") for line in lines]
    rows[a + 1][1], rows[b + 1][1] = rows[b + 1][1], rows[a + 1][1]
    return [",".join(r) for r in rows]


def test_another_data_file_on_resume_refuses_in_one_line(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(cfg(data_dir, run_dir), Console(width=120)) == 0
    shorter = copy_data(data_dir, tmp_path / "shorter", edit=lambda lines: lines[:1000])  # rows 0-998
    assert run(cfg(shorter, run_dir, 900, 905)) == 2
    err = one_error_line(capsys)
    assert "another data file" in err and "bytes" in err and "resume=force" in err
    assert indices(run_dir) == [900, 901, 902]  # nothing added
    same_size = copy_data(data_dir, tmp_path / "swapped", edit=lambda lines: swap_puzzles(lines, 901, 950))
    assert (same_size / "game24" / "24.csv").stat().st_size == (data_dir / "game24" / "24.csv").stat().st_size
    assert run(cfg(same_size, run_dir, 900, 905)) == 2
    err = one_error_line(capsys)
    assert "the row of problem 901 done there differs" in err
    assert indices(run_dir) == [900, 901, 902]
    assert run(cfg(same_size, run_dir, 900, 905, "resume=force"), Console(width=120)) == 0  # asked for: added
    assert indices(run_dir) == [900, 901, 902, 903, 904]


def test_a_widened_slice_or_a_moved_file_resumes_and_a_changed_row_not_done_is_fine(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(cfg(data_dir, run_dir), Console(width=120)) == 0
    moved = copy_data(data_dir, tmp_path / "moved")  # the same file elsewhere: same size, same rows
    assert run(cfg(moved, run_dir, 900, 904), Console(width=120)) == 0
    assert indices(run_dir) == [900, 901, 902, 903]  # widened: 903 added, none redone
    other_rows = copy_data(data_dir, tmp_path / "later", edit=lambda lines: swap_puzzles(lines, 904, 950))
    assert run(cfg(other_rows, run_dir, 900, 905), Console(width=120)) == 0  # 904 was not done: nothing mixed
    assert indices(run_dir) == [900, 901, 902, 903, 904]
    assert run(cfg(data_dir, run_dir, 900, 906)) == 2  # now 904 is done with the other file's row
    assert "the row of problem 904 done there differs" in one_error_line(capsys)


# ---- results.csv is current ------------------------------------------------------------------
def test_results_csv_holds_every_row_written_when_a_run_is_stopped(data_dir, tmp_path, monkeypatch):
    from arbor_cli.runners.local import LocalRunner

    searches, seen = LocalRunner.searches, []

    def stopped_during_the_third(self, setup, problems):
        for finished in searches(self, setup, problems):
            if len(seen) == 2:
                raise KeyboardInterrupt  # Ctrl-C while the third problem is searched
            seen.append(csv_indices(tmp_path) if seen else [])  # the CSV before this row is written
            yield finished

    monkeypatch.setattr(LocalRunner, "searches", stopped_during_the_third)
    assert run(cfg(data_dir, tmp_path, 900, 904), Console(width=120)) == 130  # one line, not a traceback
    assert seen == [[], [900]]  # current after each row (before: written only once a run ended)
    assert csv_indices(tmp_path) == indices(tmp_path) == [900, 901]
    monkeypatch.undo()
    assert run(cfg(data_dir, tmp_path, 900, 904), Console(width=120)) == 0  # the lock went with the stop
    assert csv_indices(tmp_path) == indices(tmp_path) == [900, 901, 902, 903]
