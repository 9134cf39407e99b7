"""The body of `arbor-solve`: build, search each problem, write results.

A plain function over a composed config, so tests call it with ``compose()`` and no Hydra app.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arbor_cli.budget import below_floor_note, check_budget
from arbor_cli.build import USER_ERRORS, Setup, load, prepare
from arbor_cli.report import results_table
from arbor_cli.residency import RESIDENCY_FILE
from arbor_cli.results import CSV_FILE, EVENTS_FILE, RESULTS_FILE, TRACES_FILE, append_jsonl, load_done, write_csv
from arbor_cli.resume import claim
from arbor_cli.runners import Finished, Runner, RunnerError, build_runner
from arbor_cli.runners.finished import unrun_row
from arbor_cli.runners.local import LocalRunner
from arbor_cli.tree_export import load_tree, render_tree, write_tree


def run(cfg: DictConfig, console: Console | None = None) -> int:
    """Solve the configured problems; returns a process exit code (0 ok, 2 bad input)."""
    console = console or Console()
    try:
        runner = build_runner(cfg)  # first: runner=ray without Ray fails before the model loads
        prepared = prepare(cfg, device=runner.driver_device)  # every setting checked; no model yet
        run_dir = resolve_run_dir(cfg)
        lock = claim(run_dir, cfg, prepared.task, prepared.problems)  # this run alone writes run_dir until its last row
    except USER_ERRORS as exc:
        return _error(exc)
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
    return 0


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


def write_finished(run_dir: Path, finished: Finished) -> None:
    """Append one problem's record to the run dir; its results row goes last (a problem is done once its row is)."""
    if finished.tree is not None:
        write_tree(run_dir, finished.index, finished.tree)
    append_jsonl(run_dir / TRACES_FILE, {"index": finished.index, "trace": finished.trace})
    append_jsonl(run_dir / EVENTS_FILE, {"index": finished.index, "events": finished.events})
    if finished.residency is not None:
        append_jsonl(run_dir / RESIDENCY_FILE, finished.residency)
    append_jsonl(run_dir / RESULTS_FILE, finished.row)


def verifier_title(setup: Setup) -> str:
    """The verifier as a table title names it: "verifier llm_value", "verifier game24_oracle: oracle (upper bound)"."""
    label = f": {setup.verifier.label}" if setup.verifier.label else ""
    return f"verifier {setup.verifier.name}{label}"


def resolve_run_dir(cfg: DictConfig) -> Path:
    """``cfg.run_dir`` when set, else Hydra's output dir for this job."""
    if cfg.get("run_dir"):
        error = run_dir_error(cfg.run_dir)
        if error:
            raise ValueError(error)
        path = Path(cfg.run_dir)
    else:
        from hydra.core.hydra_config import HydraConfig

        path = Path(HydraConfig.get().runtime.output_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_dir_error(run_dir: object) -> str | None:
    """``run_dir``, when set, must be a folder or a path one can be made at (Hydra writes there first)."""
    if not run_dir:
        return None
    path = Path(str(run_dir))
    blocked = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        what = "is" if blocked == path else f"lies under {blocked}, which is"
        return f"run_dir={run_dir}: {what} a file, not a folder; valid: a folder (made when missing)"
    return None


def show_trees(console: Console, run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Print each problem's best path and search tree (read back from ``trees/<index>.json``)."""
    for row in rows:
        record = load_tree(run_dir, int(row["index"]))
        if record is not None:
            console.print(render_tree(record))


def _error(exc: Exception) -> int:
    print(f"arbor-solve: error: {exc}", file=sys.stderr)
    return 2


def _choice(cfg: DictConfig, group: str) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group, group)
    except ValueError:
        return str(cfg.get(group, {}).get("_target_", group)).rsplit(".", 1)[-1]
