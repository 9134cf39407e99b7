"""The body of `arbor-solve`: build, search each problem, write results.

A plain function over a composed config, so tests call it with ``compose()`` and no Hydra app.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arbor_cli.budget import below_floor_note, check_budget
from arbor_cli.build import USER_ERRORS, Setup, load, prepare
from arbor_cli.report import results_table
from arbor_cli.residency import RESIDENCY_FILE
from arbor_cli.results import (
    CSV_FILE,
    EVENTS_FILE,
    RESULTS_FILE,
    TRACES_FILE,
    TREES_DIR,
    append_jsonl,
    load_done,
    write_csv,
)
from arbor_cli.resume import claim
from arbor_cli.runners import Finished, Runner, RunnerError, build_runner
from arbor_cli.runners.finished import unrun_row
from arbor_cli.runners.local import LocalRunner
from arbor_cli.switches import normalize_switches
from arbor_cli.tree_export import load_tree, render_tree, write_tree

#: exit codes: bad input (before any search), a problem failed or a write failed, interrupted (Ctrl-C)
BAD_INPUT, FAILED, INTERRUPTED = 2, 1, 130
#: when this module was imported: ``arbor-solve`` imports it before Hydra makes the run's folders, so a
#: folder made after it was made by this process (:func:`remove_fresh_dirs`)
IMPORTED = time.time()


@dataclass
class RunState:
    """What a run knows so far (for the line an interruption or a failed write ends it with)."""

    run_dir: Path | None = None
    problems: int = 0


def run(cfg: DictConfig, console: Console | None = None) -> int:
    """Solve the configured problems; returns a process exit code: 0 ok, 2 bad input (nothing written),
    1 when a problem failed or a result could not be written, 130 when interrupted (what is done is kept)."""
    state = RunState()
    try:
        return _run(cfg, console or Console(), state)
    except KeyboardInterrupt:
        print(f"arbor-solve: interrupted: {_kept(state)}", file=sys.stderr)
        return INTERRUPTED
    except RunWriteError as exc:
        print(f"arbor-solve: error: {exc}; {_kept(state)}", file=sys.stderr)
        return FAILED


def _run(cfg: DictConfig, console: Console, state: RunState) -> int:
    try:
        normalize_switches(cfg)  # view=off is false, view=maybe refused: before anything reads a switch
        runner = build_runner(cfg)  # first: runner=ray without Ray fails before the model loads
        prepared = prepare(cfg, device=runner.driver_device)  # every setting checked; no model yet
        run_dir = resolve_run_dir(cfg)
        lock = claim(run_dir, cfg, prepared.task, prepared.problems)  # this run alone writes run_dir until its last row
    except USER_ERRORS as exc:
        _leave_nothing()
        return _error(exc)
    state.run_dir, state.problems = run_dir, len(prepared.problems)
    record_hydra_files(cfg)  # the run is accepted: now Hydra's record of it may be written
    try:
        setup = load(prepared, device=runner.driver_device)
        if setup.policies.chosen is not None:  # policy.budget_tokens=auto: the budget and how it was chosen
            console.print(setup.policies.chosen.note, soft_wrap=True)
        infeasible = check_budget(setup.policies, setup.task, setup.problems, setup.loaded.tokenizer)
        lossy = below_floor_note(setup.policies, setup.task, setup.problems, setup.loaded.tokenizer)
        if lossy is not None:
            console.print(lossy, soft_wrap=True)
    except USER_ERRORS as exc:
        lock.release()
        return _error(exc)
    with lock:
        try:
            rows = solve_all(setup, run_dir, console, infeasible, runner)
        except RunnerError as exc:  # the runner cannot run at all (no cluster, no worker could start)
            return _error(exc)
    if cfg.get("show_tree", False):
        show_trees(console, run_dir, rows)
    title = f"{setup.task.name} · {_choice(cfg, 'controller')} · {_choice(cfg, 'policy')} · {verifier_title(setup)}"
    console.print(results_table(rows, title=title, width=console.width))
    solved = sum(bool(r.get("solved")) for r in rows)
    console.print(f"solved {solved}/{len(rows)} {setup.task.name} problems ({verifier_title(setup)})")
    console.print(f"results: {run_dir / RESULTS_FILE}")
    if cfg.get("view", False):
        from arbor_cli.view import write_views

        console.print(f"view: {write_views(run_dir)}")
    return _failures(rows)


def _failures(rows: list[dict]) -> int:
    """0, or :data:`FAILED` with one line on stderr when a problem of the slice failed (an error that is
    not an OOM: an OOM is a result) or a record of it could not be written."""
    failed = [r for r in rows if (r.get("error") and not r.get("oom")) or r.get("write_error")]
    if not failed:
        return 0
    first = failed[0]
    why = first.get("error") if first.get("error") and not first.get("oom") else first.get("write_error")
    print(
        f"arbor-solve: error: {len(failed)} of {len(rows)} problems failed (problem {first['index']}: "
        f"{str(why).splitlines()[0] if why else '?'}); their rows in results.jsonl say why",
        file=sys.stderr,
    )
    return FAILED


def _kept(state: RunState) -> str:
    """How many problems a stopped run keeps and how to go on."""
    if state.run_dir is None:
        return "no problem had started; nothing was written"
    kept = len(load_done(state.run_dir))
    return (
        f"{kept} of {state.problems} problems are kept in {state.run_dir / RESULTS_FILE}; "
        "run the same command again to resume"
    )


def _leave_nothing() -> None:
    """A refused run: the empty folders Hydra made for it go (nothing of it stays on disk)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        remove_fresh_dirs(Path(HydraConfig.get().runtime.output_dir), since=IMPORTED)


def solve_all(
    setup: Setup,
    run_dir: Path,
    console: Console,
    infeasible: dict[int, str] | None = None,
    runner: Runner | None = None,
) -> list[dict]:
    """Search every problem not yet in ``run_dir``'s results; returns all rows of the slice.

    ``infeasible`` problems (index -> why their budget cannot work) are recorded as OOM unrun. The
    ``runner`` (default: this process, ``concurrency`` searches at once) searches the rest and
    yields their records as each finishes, in any order; this function alone writes them, so each
    problem is written once whichever runner searched it (resume is unchanged). ``results.csv`` is
    rewritten with every row, so it is current when a run is killed.
    """
    infeasible, done, rows = infeasible or {}, load_done(run_dir), {}
    runner = runner or LocalRunner()
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    todo = []
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(setup.task.name, total=len(setup.problems))
        for problem in setup.problems:
            if problem.index in done:
                rows[problem.index] = done[problem.index]
            elif problem.index in infeasible:
                rows[problem.index] = unrun_row(setup, problem, infeasible[problem.index], oom=True)
                append_jsonl(run_dir / RESULTS_FILE, rows[problem.index])
            else:
                todo.append(problem)
                continue
            progress.advance(bar)
        if rows:
            write_csv(run_dir / CSV_FILE, [rows[p.index] for p in setup.problems if p.index in rows])
        for finished in runner.searches(setup, todo):
            question = str(finished.row.get("question", ""))[:30]
            progress.update(bar, description=f"{setup.task.name} #{finished.index} {question}")
            write_finished(run_dir, finished)
            rows[finished.index] = finished.row
            write_csv(run_dir / CSV_FILE, [rows[p.index] for p in setup.problems if p.index in rows])
            progress.advance(bar)
    return [rows[p.index] for p in setup.problems]


class RunWriteError(OSError):
    """A problem's results row could not be written (a full disk, a folder made read-only): the run stops."""


def write_finished(run_dir: Path, finished: Finished) -> None:
    """Append one problem's record to the run dir; its results row goes last (a problem is done once its row is).

    A tree, trace, events or residency record that cannot be written does not lose the problem's result:
    the row records why (``write_error``) and is written still. A row that cannot be written stops the run
    (:class:`RunWriteError`, one line naming the file).
    """
    parts = [
        (lambda: write_tree(run_dir, finished.index, finished.tree)) if finished.tree is not None else None,
        lambda: append_jsonl(run_dir / TRACES_FILE, {"index": finished.index, "trace": finished.trace}),
        lambda: append_jsonl(run_dir / EVENTS_FILE, {"index": finished.index, "events": finished.events}),
        (lambda: append_jsonl(run_dir / RESIDENCY_FILE, finished.residency)) if finished.residency else None,
    ]
    for part in filter(None, parts):
        try:
            part()
        except OSError as exc:
            finished.row.setdefault("write_error", _os_error(exc))
    try:
        append_jsonl(run_dir / RESULTS_FILE, finished.row)
    except OSError as exc:
        raise RunWriteError(f"cannot write problem {finished.index}'s row: {_os_error(exc)}") from None


def _os_error(exc: OSError) -> str:
    """``file: reason`` of an OSError (``trees/902.graphml: No space left on device``)."""
    where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
    return f"{where}{exc.strerror or exc}"


def verifier_title(setup: Setup) -> str:
    """The verifier as a table title names it: "verifier llm_value", "verifier game24_oracle: oracle (upper bound)"."""
    label = f": {setup.verifier.label}" if setup.verifier.label else ""
    return f"verifier {setup.verifier.name}{label}"


def resolve_run_dir(cfg: DictConfig) -> Path:
    """``cfg.run_dir`` when set, else Hydra's output dir for this job; made when missing. Refused in one
    line (ValueError) when it cannot take the run's files (a file in a folder's place, or the reverse)."""
    if cfg.get("run_dir") is not None:
        error = run_dir_error(cfg.run_dir)
        if error:
            raise ValueError(error)
        path = Path(str(cfg.run_dir)).expanduser()
    else:
        from hydra.core.hydra_config import HydraConfig

        path = Path(HydraConfig.get().runtime.output_dir)
    path.mkdir(parents=True, exist_ok=True)
    for name, folder in RUN_DIR_ENTRIES:
        entry = path / name
        if entry.exists() and entry.is_dir() != folder:
            kind, want = ("a folder", "a file") if entry.is_dir() else ("a file", "a folder")
            raise ValueError(
                f"{entry} is {kind}, where the run keeps {want}; valid: move it away or pick another run_dir"
            )
    return path


#: what a run dir holds, by name: (name, whether it is a folder)
RUN_DIR_ENTRIES = (
    (TREES_DIR, True), (RESULTS_FILE, False), (TRACES_FILE, False), (EVENTS_FILE, False), (RESIDENCY_FILE, False),
    (CSV_FILE, False),
)  # fmt: skip


def run_dir_error(run_dir: object, key: str = "run_dir") -> str | None:
    """A run dir (``run_dir``, or ``paths.output_dir`` under which Hydra makes one), when set, must be a
    folder or a path one can be made at, by this user: checked before Hydra writes anything there.
    Returns the error line, or None."""
    if run_dir is None:
        return None
    if not str(run_dir).strip():
        return f"{key}={run_dir!r} is empty (the run would write into the working directory); valid: a folder, or null"
    path = Path(str(run_dir)).expanduser()
    blocked = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        what = "is" if blocked == path else f"lies under {blocked}, which is"
        return f"{key}={run_dir}: {what} a file, not a folder; valid: a folder (made when missing)"
    base = next(p for p in (path, *path.parents) if p.exists())
    try:  # can this user make folders there? (root passes permission bits; a read-only mount does not)
        os.rmdir(tempfile.mkdtemp(dir=base, prefix=".arbor-write-check-"))
    except OSError as exc:
        return (
            f"{key}={run_dir}: cannot write under {base} ({exc.strerror or exc}); valid: a folder this user can write"
        )
    return None


def remove_fresh_dirs(path: Path, since: float) -> None:
    """Remove ``path`` and its parents while each is an empty folder made after ``since`` (a refused
    run leaves nothing behind, not even the folders Hydra made for it)."""
    for folder in (path, *path.parents):
        try:
            if not folder.is_dir() or any(folder.iterdir()) or folder.stat().st_ctime < since:
                return
            folder.rmdir()
        except OSError:
            return


def record_hydra_files(cfg: DictConfig) -> None:
    """Hydra's record of the run (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``), written once
    the run dir has accepted the run (conf/config.yaml sets ``hydra.output_subdir: null`` so that Hydra
    does not write them before: a refused rerun never overwrites the record of the run it refused to
    join). Nothing outside a Hydra app (a composed config)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    out = Path(hydra_cfg.runtime.output_dir) / ".hydra"
    out.mkdir(parents=True, exist_ok=True)
    for name, node in (
        ("config.yaml", cfg),
        ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
        ("overrides.yaml", hydra_cfg.overrides.task),
    ):
        (out / name).write_text(OmegaConf.to_yaml(node), encoding="utf-8")


def show_trees(console: Console, run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Print each problem's best path and search tree (read back from ``trees/<index>.json``)."""
    for row in rows:
        record = load_tree(run_dir, int(row["index"]))
        if record is not None:
            console.print(render_tree(record))


def _error(exc: Exception) -> int:
    """One line on stderr (a message of several lines, a tokenizer's say, joined), exit code 2."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    print(f"arbor-solve: error: {text}", file=sys.stderr)
    return 2


def _choice(cfg: DictConfig, group: str) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group, group)
    except ValueError:
        return str(cfg.get(group, {}).get("_target_", group)).rsplit(".", 1)[-1]
