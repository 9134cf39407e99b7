"""The user's path, tried as a new user tries it (issue 63): every input the CLI cannot run is one line
naming the value or file, exit 2, before the model loads where it is known then; a run that is refused
writes nothing; a failure during a run keeps every result and ends non-zero; Ctrl-C ends in one line.

Each test is one probe of the issue, which failed on main before this (a traceback, a late failure
after the model loaded, exit 0 over a failed problem, or a record overwritten).
"""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

import arbor_cli.build
import arbor_cli.run
from arbor_cli.build import compose_config
from arbor_cli.results import RESULTS_FILE
from arbor_cli.run import run

SOLVE = [sys.executable, "-m", "arbor_cli.solve"]


def base(data_dir: Path, run_dir: Path | None, end: int = 901) -> list[str]:
    where = [f"run_dir={run_dir}"] if run_dir is not None else []
    return ["model=tiny-random", f"paths.data_dir={data_dir}", *where, f"task.end={end}"]


def solve(*argv: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SOLVE, *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def one_line(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one stderr line of a refused run (and its exit code)."""
    assert proc.returncode == code, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(arbor_cli.build, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def refused(capsys, argv: list[str]) -> str:
    """``run`` on a composed config: exit 2 and one error line (returned)."""
    assert run(compose_config(argv), Console(width=120)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("arbor-solve: error: "), captured.err
    return lines[0]


# ---- a rerun refused writes nothing; an empty run_dir is refused -----------------------------------
def test_a_refused_rerun_leaves_the_runs_record_as_it_was(data_dir, tmp_path):
    """A rerun refused because the run dir holds another config (seed 0 -> 7) overwrote .hydra/config.yaml
    and overrides.yaml, so the record no longer matched the results beside it."""
    run_dir = tmp_path / "run"
    assert solve(*base(data_dir, run_dir)).returncode == 0
    record = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    assert set(record) == {"config.yaml", "hydra.yaml", "overrides.yaml"} and b"seed: 0" in record["config.yaml"]
    line = one_line(solve(*base(data_dir, run_dir), "seed=7"))
    assert "holds results of another config (seed: 0 -> 7)" in line
    assert {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == record


def test_an_empty_run_dir_is_refused_and_the_working_directory_stays_empty(data_dir, tmp_path):
    """``run_dir=`` wrote the whole run into the current directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    line = one_line(solve(*base(data_dir, None), "run_dir=", cwd=cwd))
    assert line == (
        "arbor-solve: error: run_dir='' is empty (the run would write into the working directory); valid: a folder, "
        "or null"
    )
    assert list(cwd.iterdir()) == []


def test_a_run_dir_that_cannot_be_made_is_one_line(data_dir, tmp_path):
    """A run dir under a file, or where this user cannot make folders (as root too: /proc), was a traceback."""
    (tmp_path / "afile").write_text("x")
    assert "lies under" in one_line(solve(*base(data_dir, tmp_path / "afile" / "run")))
    line = one_line(solve(*base(data_dir, Path("/proc/arbor-test/run"))))
    assert line.startswith("arbor-solve: error: run_dir=/proc/arbor-test/run: cannot write under /proc (")
    line = one_line(solve(*base(data_dir, None), f"paths.output_dir={tmp_path / 'afile'}"))
    assert line == f"arbor-solve: error: paths.output_dir={tmp_path / 'afile'}: is a file, not a folder; " + (
        "valid: a folder (made when missing)"
    )


def test_a_run_dir_with_a_file_where_the_trees_go_is_refused_before_any_search(data_dir, tmp_path, no_model, capsys):
    """``trees`` replaced by a file: problem 902's result was lost when its tree could not be written."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trees").write_text("not a folder")
    line = refused(capsys, base(data_dir, run_dir))
    assert line == f"arbor-solve: error: {run_dir / 'trees'} is a file, where the run keeps a folder; " + (
        "valid: move it away or pick another run_dir"
    )


# ---- failures during a run keep what is done and end non-zero --------------------------------------
def test_a_tree_that_cannot_be_written_keeps_the_problems_result(data_dir, tmp_path, monkeypatch, capsys):
    """A full disk while writing a .graphml (``OSError: No space left on device``) was a traceback and the
    problem's result was lost: now its row is written, saying which file failed, and the run ends 1."""

    def full_disk(run_dir, index, record):
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "trees" / f"{index}.graphml"))

    monkeypatch.setattr(arbor_cli.run, "write_tree", full_disk)
    run_dir = tmp_path / "run"
    assert run(compose_config(base(data_dir, run_dir, end=902)), Console(width=120)) == 1
    rows = [json.loads(line) for line in (run_dir / RESULTS_FILE).read_text().splitlines()]
    assert [r["index"] for r in rows] == [900, 901] and all(r["answer"] is not None or r["error"] for r in rows)
    assert rows[0]["write_error"] == f"{run_dir}/trees/900.graphml: No space left on device"
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("arbor-solve: error: 2 of 2 problems failed (problem 900: ")


def test_a_row_that_cannot_be_written_stops_the_run_in_one_line(data_dir, tmp_path, monkeypatch, capsys):
    calls = []
    append = arbor_cli.run.append_jsonl

    def full_after_one_row(path, row):
        if path.name == RESULTS_FILE and calls:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        calls.append(path.name) if path.name == RESULTS_FILE else None
        append(path, row)

    monkeypatch.setattr(arbor_cli.run, "append_jsonl", full_after_one_row)
    run_dir = tmp_path / "run"
    assert run(compose_config(base(data_dir, run_dir, end=903)), Console(width=120)) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"arbor-solve: error: cannot write problem 901's row: {run_dir / RESULTS_FILE}: No space left on device; "
        f"1 of 3 problems are kept in {run_dir / RESULTS_FILE}; run the same command again to resume"
    )


def test_a_run_whose_problem_failed_ends_non_zero(data_dir, tmp_path, monkeypatch, capsys):
    """A problem that fails inside its search is recorded (the others go on) and the run's exit code is 1."""
    from arbor_runtime.controllers.bfs import BFSController

    search = BFSController.search

    def fails_on_901(self, root):
        if self.problem.index == 901:
            raise RuntimeError("a bug in the search")
        return search(self, root)

    monkeypatch.setattr(BFSController, "search", fails_on_901)
    run_dir = tmp_path / "run"
    assert run(compose_config(base(data_dir, run_dir, end=903)), Console(width=120)) == 1
    rows = {json.loads(x)["index"]: json.loads(x) for x in (run_dir / RESULTS_FILE).read_text().splitlines()}
    assert sorted(rows) == [900, 901, 902] and rows[901]["error"] == "RuntimeError: a bug in the search"
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "arbor-solve: error: 1 of 3 problems failed (problem 901: RuntimeError: a bug in the search); "
        "their rows in results.jsonl say why"
    )


def test_ctrl_c_ends_in_one_line_saying_what_is_kept_and_how_to_resume(data_dir, tmp_path):
    """Ctrl-C was a 110-line KeyboardInterrupt traceback (the rows were kept and resume was exact)."""
    run_dir = tmp_path / "run"
    cmd = [*SOLVE, *base(data_dir, run_dir, end=930)]
    # A terminal's Ctrl-C: SIGINT handled as the shell's foreground job would be (a suite started in the
    # background inherits SIGINT ignored, and Python then never raises KeyboardInterrupt)
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=restore)
    end = time.monotonic() + 120
    while not (run_dir / RESULTS_FILE).is_file() or not (run_dir / RESULTS_FILE).read_text().count("\n"):
        assert time.monotonic() < end and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    kept = (run_dir / RESULTS_FILE).read_text().count("\n")
    assert proc.returncode == 130
    assert err.strip().splitlines() == [
        f"arbor-solve: interrupted: {kept} of 30 problems are kept in {run_dir / RESULTS_FILE}; run the same command "
        "again to resume"
    ]


# ---- values known before the model loads -------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("model.device=cuda:7", "model.device='cuda:7': this machine has no CUDA device; valid: cpu"),
        ("model.device=banana", "model.device='banana' is not a device; valid: cpu, cuda, cuda:N"),
        ("controller.n_generate=5000", "controller.n_generate=5000 must be an integer from 1 to 4096"),
        ("policy=lychee policy.dense_layers=[99]", "policy.dense_layers=[99]: layer 99 is not a layer of the model"),
    ],
)
def test_a_value_the_machine_or_model_cannot_take_is_one_line_before_the_model_loads(
    override, said, data_dir, tmp_path, no_model, capsys
):
    import torch

    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("a CUDA machine has a device")  # the banana line still runs there
    argv = [*base(data_dir, tmp_path / "run"), *override.split(), "task.propose=sample"]
    assert said in refused(capsys, argv)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize("kind", ["truncated", "binary", "folder", "layer out of range", "not an object"])
def test_a_broken_calibration_file_is_named_before_the_model_loads(
    kind, data_dir, tmp_path, no_model, capsys, monkeypatch
):
    """A corrupt or unreadable dense_layers.json in the cache folder was a traceback after the model loaded,
    never naming the file."""
    from arbor_runtime.loading import tiny_random_model
    from arbor_runtime.policies.kvp_weights import model_fingerprint

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("ARBOR_CACHE_DIR", str(cache))
    path = cache / "dense_layers.json"
    entry = {"model": "tiny", "layers": [99], "source": "hand"}
    {
        "truncated": lambda: path.write_text('{"models": {"ab'),
        "binary": lambda: path.write_bytes(bytes(range(256))),
        "folder": lambda: path.mkdir(),
        "layer out of range": lambda: path.write_text(
            json.dumps({"models": {model_fingerprint(tiny_random_model()): entry}})
        ),
        "not an object": lambda: path.write_text("[1, 2, 3]"),
    }[kind]()
    line = refused(capsys, [*base(data_dir, tmp_path / "run"), "policy=lychee"])
    assert line.startswith(f"arbor-solve: error: {path}")
    if kind == "layer out of range":
        assert line.endswith("layer 99 is not a layer of the model; valid: 0..1")


def test_a_budget_reference_or_msve_calibration_that_does_not_parse_is_named(data_dir, tmp_path, no_model, capsys):
    bad = tmp_path / "msve.json"
    bad.write_text('{"weights": {"value": 0.')
    line = refused(capsys, [*base(data_dir, tmp_path / "run"), "policy=arbor", f"policy.calibration={bad}"])
    assert line.startswith(f"arbor-solve: error: MSVE calibration file '{bad}' is not readable JSON (")
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / RESULTS_FILE).write_text(json.dumps({"index": 900, "peak_device_tokens": 100, "oom": False}) + "\n")
    (ref / "config_fingerprint.json").write_text('{"fingerprint": "ab')
    argv = [*base(data_dir, tmp_path / "run2"), "policy=arbor", "policy.budget_tokens=null", "policy.budget_ratio=0.5"]
    line = refused(capsys, [*argv, f"policy.budget_reference={ref}"])
    assert line.startswith(f"arbor-solve: error: {ref / 'config_fingerprint.json'}: not a readable fingerprint record")


def test_an_unreachable_ray_address_fails_at_once_in_one_line(data_dir, tmp_path, no_model, capsys):
    """``runner=ray runner.address=127.0.0.1:1`` was 150 s of Ray's retry warnings and nothing from us."""
    pytest.importorskip("ray")
    start = time.monotonic()
    line = refused(capsys, [*base(data_dir, tmp_path / "run"), "runner=ray", "runner.address=127.0.0.1:1"])
    assert time.monotonic() - start < 30
    assert line.startswith("arbor-solve: error: runner.address=127.0.0.1:1: nothing answers there (")


# ---- run-dir files that are not records ------------------------------------------------------------
@pytest.mark.parametrize("junk", ['{"foo": 1}', '{"index": "abc"}', "[1, 2, 3]", "null"])
def test_a_results_line_that_is_not_a_record_is_set_aside_and_named(junk, data_dir, tmp_path, capsys):
    """Resume stopped with ``error: 'index'`` (naming neither file nor line) and left the line where it was."""
    run_dir = tmp_path / "run"
    assert run(compose_config(base(data_dir, run_dir)), Console(width=120)) == 0
    with (run_dir / RESULTS_FILE).open("a") as fh:
        fh.write(junk + "\n")
    assert run(compose_config(base(data_dir, run_dir, end=902)), Console(width=120)) == 0
    rows = [json.loads(line) for line in (run_dir / RESULTS_FILE).read_text().splitlines()]
    assert [r["index"] for r in rows] == [900, 901]
    assert (run_dir / (RESULTS_FILE + ".corrupt")).read_text() == junk + "\n"


@pytest.mark.parametrize("junk", ['{"index": "abc"}', "null"])
def test_arbor_view_names_a_line_or_a_tree_it_cannot_read_and_writes_the_rest(junk, data_dir, tmp_path):
    """``arbor-view`` on such a line, or on a truncated trees/N.json, was a traceback."""
    run_dir = tmp_path / "run"
    assert run(compose_config(base(data_dir, run_dir, end=902)), Console(width=120)) == 0
    with (run_dir / RESULTS_FILE).open("a") as fh:
        fh.write(junk + "\n")
    tree = run_dir / "trees" / "901.json"
    tree.write_bytes(tree.read_bytes()[:50])
    proc = subprocess.run([sys.executable, "-m", "arbor_cli.view", str(run_dir)], capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    line, tree_line = proc.stderr.strip().splitlines()
    assert line == (
        f"arbor-view: warning: {run_dir / RESULTS_FILE}: line 3 not a record (a JSON object with an integer index): "
        "left out"
    )
    assert tree_line.startswith(f"arbor-view: warning: {tree}: not a readable tree (")
    assert tree_line.endswith("; problem 901's page shows none")
    assert (run_dir / "view" / "900.html").is_file() and (run_dir / "view" / "901.html").is_file()


# ---- calibration writes ---------------------------------------------------------------------------
WRITER = """
import sys
from pathlib import Path
import arbor_runtime.sparse.calibrated as c
path, who = Path(sys.argv[1]), sys.argv[2]
for k in range(40):
    c.model_fingerprint = lambda model, k=k: f"{who}-{k}"
    c.write_calibration(None, c.DenseLayers(model=who, layers=(k % 3,), source="test"), path)
"""


def test_two_calibration_writers_at_once_keep_every_entry(tmp_path):
    """Two ``benchmarks.longctx.calibrate --write`` runs at once lost each other's entries (48 of 80 survived):
    read-modify-replace without a lock."""
    path = tmp_path / "dense_layers.json"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), who]) for who in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    from arbor_runtime.sparse.calibrated import read_calibrations

    assert len(read_calibrations(path)) == 80


# ---- budget references --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def references(data_dir, tmp_path_factory) -> dict[str, Path]:
    """Runs of problems 900-901 to serve as budget references: full (the right one), arbor capped at 600
    tokens, full at another breadth, and full on GSM8K."""
    root = tmp_path_factory.mktemp("refs")
    runs = {
        "full": ["policy=full"],
        "arbor-600": ["policy=arbor", "policy.budget_tokens=600"],
        "full-breadth-2": ["policy=full", "controller.breadth=2"],
        "gsm8k": ["task=gsm8k", "policy=full", "task.start=0", "task.end=2"],
    }
    for name, extra in runs.items():
        argv = [*base(data_dir, root / name, end=902), *extra]
        assert run(compose_config(argv), Console(width=120, quiet=True)) == 0
    return {name: root / name for name in runs}


def budgeted(data_dir: Path, run_dir: Path, reference: Path, *extra: str) -> list[str]:
    over = [
        "policy=arbor",
        "policy.budget_tokens=null",
        "policy.budget_ratio=0.5",
        f"policy.budget_reference={reference}",
    ]
    return [*base(data_dir, run_dir, end=902), *over, *extra]


def test_a_reference_made_under_a_budget_is_refused(references, data_dir, tmp_path, no_model, capsys):
    """A reference made by an arbor run capped at 600 tokens gave budgets of half the wrong peak, exit 0."""
    line = refused(capsys, budgeted(data_dir, tmp_path / "run", references["arbor-600"]))
    assert line == (
        f"arbor-solve: error: policy.budget_reference='{references['arbor-600']}' ran ArborPolicy with "
        "policy.budget_tokens=600: its peaks are not what the search needs unbudgeted; valid: a run with no budget "
        "(policy=full)"
    )


def test_a_reference_of_another_task_is_refused(references, data_dir, tmp_path, no_model, capsys):
    """A reference of another task that holds the same indices (GSM8K questions 0-1 for Game of 24 rows 0-1)
    gave a budget from the wrong task, exit 0."""
    argv = budgeted(data_dir, tmp_path / "run", references["gsm8k"], "task.start=0", "task.end=2")
    line = refused(capsys, argv)
    assert line.startswith(
        f"arbor-solve: error: policy.budget_reference='{references['gsm8k']}' is a run of other settings "
        '(task._target_: "arbor_runtime.tasks.stepwise.StepwiseTask" -> "arbor_runtime.tasks.game24.Game24Task", '
    )


def test_a_reference_of_another_search_is_refused_unless_named(references, data_dir, tmp_path, capsys):
    reference = references["full-breadth-2"]
    line = refused(capsys, budgeted(data_dir, tmp_path / "a", reference))
    assert line == (
        f"arbor-solve: error: policy.budget_reference='{reference}' is a run of other settings (controller.breadth: "
        "2 -> 3); valid: a run of the same task, model, search and seed, or name the settings that may differ in "
        "policy.reference_may_differ"
    )
    argv = budgeted(data_dir, tmp_path / "b", reference, "policy.reference_may_differ=[controller.breadth]")
    assert run(compose_config(argv), Console(width=120, quiet=True)) == 0  # a wider search inside a narrower peak


def test_the_right_reference_sets_half_of_each_problems_peak(references, data_dir, tmp_path):
    assert run(compose_config(budgeted(data_dir, tmp_path / "run", references["full"])), Console(quiet=True)) == 0
    peaks = {r["index"]: r["peak_device_tokens"] for r in map(json.loads, (references["full"] / RESULTS_FILE).open())}
    rows = [json.loads(line) for line in (tmp_path / "run" / RESULTS_FILE).read_text().splitlines()]
    assert {r["index"]: r["budget_tokens"] for r in rows} == {i: int(0.5 * p) for i, p in peaks.items()}


def test_a_reference_without_a_recorded_config_is_refused(references, data_dir, tmp_path, no_model, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / RESULTS_FILE).write_bytes((references["full"] / RESULTS_FILE).read_bytes())
    line = refused(capsys, budgeted(data_dir, tmp_path / "run", bare))
    assert line.startswith(f"arbor-solve: error: policy.budget_reference='{bare}' has no recorded config (")
