"""The body of `arbor-solve`: build, search each problem, write results.

A plain function over a composed config, so tests call it with ``compose()`` and no Hydra app.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arbor_cli.budget import check_budget
from arbor_cli.build import USER_ERRORS, Setup, build
from arbor_cli.report import results_table
from arbor_cli.results import CSV_FILE, EVENTS_FILE, RESULTS_FILE, TRACES_FILE, append_jsonl, load_done, write_csv
from arbor_cli.resume import check_resume
from arbor_cli.tree_export import load_tree, render_tree, tree_record, write_tree
from arbor_runtime import KVBudgetExceeded, Node, Runtime
from arbor_runtime.events import EventLog
from arbor_runtime.metrics import RuntimeMetrics
from controllers.base import Controller, SearchResult
from tasks.base import Problem

log = logging.getLogger(__name__)


def run(cfg: DictConfig, console: Console | None = None) -> int:
    """Solve the configured problems; returns a process exit code (0 ok, 2 bad input)."""
    console = console or Console()
    try:
        setup = build(cfg)
        infeasible = check_budget(setup.policies, setup.task, setup.problems, setup.loaded.tokenizer)
        run_dir = resolve_run_dir(cfg)
        check_resume(run_dir, cfg)
    except USER_ERRORS as exc:
        print(f"arbor-solve: error: {exc}", file=sys.stderr)
        return 2
    rows = solve_all(setup, run_dir, console, infeasible)
    write_csv(run_dir / CSV_FILE, rows)
    if cfg.get("show_tree", False):
        show_trees(console, run_dir, rows)
    title = f"{setup.task.name} · {_choice(cfg, 'controller')} · {_choice(cfg, 'policy')} · {verifier_title(setup)}"
    console.print(results_table(rows, title=title, width=console.width))
    solved = sum(bool(r.get("solved")) for r in rows)
    console.print(f"solved {solved}/{len(rows)} {setup.task.name} problems ({verifier_title(setup)})")
    console.print(f"results: {run_dir / RESULTS_FILE}")
    return 0


def solve_all(setup: Setup, run_dir: Path, console: Console, infeasible: dict[int, str] | None = None) -> list[dict]:
    """Search every problem not yet in ``run_dir``'s results; returns all rows of the slice.

    ``infeasible`` problems (index -> why their budget cannot work) are recorded as OOM unrun. With
    ``concurrency=N`` (N > 1), N searches run at once in one shared runtime; rows are appended as
    each problem finishes (in any order; resume is unchanged).
    """
    infeasible, done, rows = infeasible or {}, load_done(run_dir), {}
    name, cfg = setup.task.name, setup.cfg
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    todo = []
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(name, total=len(setup.problems))
        for problem in setup.problems:
            if problem.index in done:
                rows[problem.index] = done[problem.index]
            elif problem.index in infeasible:
                rows[problem.index] = _unrun_row(setup, problem, infeasible[problem.index])
                append_jsonl(run_dir / RESULTS_FILE, rows[problem.index])
            else:
                todo.append(problem)
                continue
            progress.advance(bar)
        for problem, solved in _searches(setup, todo):
            progress.update(bar, description=f"{name} #{problem.index} {problem.question[:30]}")
            if cfg.get("save_trees", True) or cfg.get("show_tree", False):
                write_tree(run_dir, problem.index, solved.tree(problem))
            solved.done()
            append_jsonl(run_dir / TRACES_FILE, {"index": problem.index, "trace": _trace(solved.metrics)})
            append_jsonl(run_dir / EVENTS_FILE, {"index": problem.index, "events": _events(solved.events)})
            append_jsonl(run_dir / RESULTS_FILE, solved.row)  # last: a problem is done once its row is
            rows[problem.index] = solved.row
            progress.advance(bar)
    return [rows[p.index] for p in setup.problems]


def _searches(setup: Setup, problems: list[Problem]) -> Iterator[tuple[Problem, Solved]]:
    """(problem, Solved) as each search finishes: one at a time in fresh runtimes, or ``concurrency``
    at once in one shared runtime (their steps batched together, one budget for all)."""
    concurrency = int(setup.cfg.get("concurrency", 1))
    if concurrency <= 1:
        for problem in problems:
            yield problem, search_one(setup, problem)
        return
    rt = setup.shared_runtime()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="search") as pool:
        futures = {pool.submit(search_shared, setup, rt, p): p for p in problems}
        for future in as_completed(futures):
            yield futures[future], future.result()


class Solved(NamedTuple):
    """One searched problem: its results row, the runtime, controller and result behind it, and the
    metrics and events that are its own (the runtime's, or its account's in a shared runtime)."""

    row: dict[str, Any]
    rt: Runtime
    controller: Controller
    result: SearchResult | None  # None after an OOM or an error
    metrics: RuntimeMetrics
    events: EventLog
    root: Node | None = None  # set in a shared runtime: released once the problem is written

    def tree(self, problem: Problem) -> dict[str, Any]:
        """The search tree as a JSON-ready record (see :mod:`arbor_cli.tree_export`)."""
        best = self.result.best if self.result is not None else None
        info = {"index": problem.index, "question": problem.question}
        return tree_record(self.rt, best, self.controller.expansions, root=self.root, **info)

    def done(self) -> None:
        """The problem is written: a shared runtime frees its tree's KV (other trees keep theirs)."""
        if self.root is not None and not self.root.released:
            self.rt.release(self.root)


def search_one(setup: Setup, problem: Problem) -> Solved:
    """One problem with a fresh runtime and controller; an OOM is recorded in the row, not raised."""
    rt = setup.runtime(problem)
    controller = setup.controller(rt)
    row, result = _search(setup, rt, controller, problem, rt.metrics, seed=None)
    return Solved(row, rt, controller, result, rt.metrics, rt.events)


def search_shared(setup: Setup, rt: Runtime, problem: Problem) -> Solved:
    """One problem in a runtime other searches share (its counts in its own account)."""
    with rt.account() as account:
        controller = setup.controller(rt)
        row, result = _search(setup, rt, controller, problem, account.metrics, seed=setup.seed(problem))
    return Solved(row, rt, controller, result, account.metrics, account.events, controller.root)


def _search(setup: Setup, rt: Runtime, controller: Controller, problem: Problem, metrics, seed):
    """The search and its results row; an OOM or an error ends this problem only (recorded)."""
    base = {"index": problem.index, "question": problem.question, "task": setup.task.name, "model": setup.loaded.spec}
    base |= {"controller": controller.name, "policy": rt.policy.name, "budget_tokens": rt.policy.budget_tokens}
    base |= search_fields(setup)
    try:
        result = controller.solve(problem, seed=seed)
    except KVBudgetExceeded as exc:
        log.info("problem %s: %s", problem.index, exc)
        row = base | {"solved": False, "oom": True, "error": str(exc), "answer": None}
    except Exception as exc:  # one failing problem does not stop the run
        log.exception("problem %s failed", problem.index)
        row = base | {"solved": False, "oom": False, "error": f"{type(exc).__name__}: {exc}", "answer": None}
    else:
        row = base | _result_fields(result) | {"oom": False, "error": None}
        row |= _metric_fields(metrics, controller.counts())
        return row, result
    row |= _metric_fields(metrics, controller.counts())
    return row, None


def search_fields(setup: Setup) -> dict[str, Any]:
    """What scored and proposed the search: every row records its verifier (an oracle's label too)
    and, for tasks with propose modes, the mode."""
    fields = {"verifier": setup.verifier.name}
    if setup.verifier.label:
        fields["verifier_label"] = setup.verifier.label
    if hasattr(setup.task, "propose_mode"):
        fields["propose"] = setup.task.propose_mode
    return fields


def verifier_title(setup: Setup) -> str:
    """The verifier as a table title names it: "verifier llm_value", "verifier game24_oracle: oracle (upper bound)"."""
    label = f": {setup.verifier.label}" if setup.verifier.label else ""
    return f"verifier {setup.verifier.name}{label}"


def resolve_run_dir(cfg: DictConfig) -> Path:
    """``cfg.run_dir`` when set, else Hydra's output dir for this job."""
    if cfg.get("run_dir"):
        path = Path(cfg.run_dir)
    else:
        from hydra.core.hydra_config import HydraConfig

        path = Path(HydraConfig.get().runtime.output_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def show_trees(console: Console, run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Print each problem's best path and search tree (read back from ``trees/<index>.json``)."""
    for row in rows:
        record = load_tree(run_dir, int(row["index"]))
        if record is not None:
            console.print(render_tree(record))


def _unrun_row(setup: Setup, problem: Problem, why: str) -> dict[str, Any]:
    """The results row of a problem whose budget cannot hold its active path (not run: an OOM)."""
    policy = setup.policies.build(problem.index)
    return {
        "index": problem.index, "question": problem.question, "task": setup.task.name, "model": setup.loaded.spec,
        "solved": False, "oom": True, "error": why, "answer": None, "policy": policy.name,
        "budget_tokens": policy.budget_tokens, "peak_device_tokens": 0, "seconds": 0.0, **search_fields(setup),
    }  # fmt: skip


def _result_fields(result: SearchResult) -> dict[str, Any]:
    extra = {k: v for k, v in result.extra.items() if isinstance(v, (bool, int, float, str))}  # e.g. dfs backtracks
    best_path = None if result.best is None else "".join(n.text for n in result.best.path()[1:])
    return extra | {
        "solved": result.solved,
        "answer": result.answer,
        "steps": result.steps,
        "seconds": round(result.seconds, 3),
        "best_path": best_path,
    }


def _metric_fields(m: RuntimeMetrics, counts: dict[str, int]) -> dict[str, Any]:
    """Runtime metrics and the search's counts (expansions, duplicates dropped, model calls)."""
    fields = m.to_dict() | counts
    fields.setdefault("seconds", round(m.runtime_seconds, 3))
    return fields


def _trace(metrics: RuntimeMetrics) -> list[dict[str, Any]]:
    return [asdict(p) for p in metrics.trace]


def _events(events: EventLog) -> list[dict[str, Any]]:
    return [
        {"seq": r.seq, "step": r.step, "t": round(r.t, 4), "kind": r.kind, "resident_tokens": r.resident_tokens,
         "host_tokens": r.host_tokens, "plan_blocks": r.plan_blocks, **r.data}
        for r in events.records
    ]  # fmt: skip


def _choice(cfg: DictConfig, group: str) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group, group)
    except ValueError:
        return str(cfg.get(group, {}).get("_target_", group)).rsplit(".", 1)[-1]
