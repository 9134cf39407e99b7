"""The body of `arbor-solve`: build model, task, verifier; search each problem; write results.

A plain function over a composed config, so tests call it with ``compose()`` and no Hydra app.
"""

from __future__ import annotations

import csv
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arbor_cli.budget import PolicyFactory, check_budget
from arbor_cli.report import results_table
from arbor_cli.results import EVENTS_FILE, RESULTS_FILE, TRACES_FILE, append_jsonl, load_done
from arbor_cli.tree_export import held_nodes, load_tree, render_tree, tree_record, write_tree
from arbor_runtime import ArborError, KVBudgetExceeded, LoadedModel, Runtime, load_model
from arbor_runtime.metrics import RuntimeMetrics
from controllers.base import Controller, SearchResult
from tasks.base import Problem, Task
from verifiers.base import Verifier

log = logging.getLogger(__name__)
USER_ERRORS = (ArborError, ValueError, FileNotFoundError, KeyError, TypeError)


def run(cfg: DictConfig, console: Console | None = None) -> int:
    """Solve the configured problems; returns a process exit code (0 ok, 2 bad input)."""
    console = console or Console()
    try:
        task, verifier = _build(cfg.task), None
        verifier = _build(cfg.verifier) if cfg.verifier.get("_target_") else default_verifier(task)
        problems = task.problems()
        policies = PolicyFactory(cfg.policy, problems)  # validates the policy before loading the model
        loaded = load_model(**_model_kwargs(cfg.model))
        infeasible = check_budget(policies, task, problems, loaded.tokenizer)
    except USER_ERRORS as exc:
        print(f"arbor-solve: error: {exc}", file=sys.stderr)
        return 2
    run_dir = resolve_run_dir(cfg)
    rows = solve_all(cfg, loaded, task, verifier, problems, run_dir, console, policies, infeasible)
    write_summary_csv(run_dir, rows)
    if cfg.get("show_tree", False):
        show_trees(console, run_dir, rows)
    console.print(results_table(rows, title=f"{task.name} · {_choice(cfg, 'controller')} · {_choice(cfg, 'policy')}"))
    console.print(f"results: {run_dir / RESULTS_FILE}")
    return 0


def solve_all(
    cfg: DictConfig,
    loaded: LoadedModel,
    task: Task,
    verifier: Verifier,
    problems: list[Problem],
    run_dir: Path,
    console: Console,
    policies: PolicyFactory | None = None,
    infeasible: dict[int, str] | None = None,
) -> list[dict[str, Any]]:
    """Search every problem not yet in ``run_dir``'s results; returns all rows of the slice.

    ``infeasible`` problems (index -> why their budget cannot work) are recorded as OOM unrun.
    """
    infeasible = infeasible or {}
    done = load_done(run_dir) if cfg.get("resume", True) else {}
    policies = policies or PolicyFactory(cfg.policy, problems)
    rows = []
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(f"{task.name}", total=len(problems))
        for problem in problems:
            if problem.index in done:
                rows.append(done[problem.index])
            elif problem.index in infeasible:
                row = _unrun_row(problem, task, loaded, policies.build(problem.index), infeasible[problem.index])
                append_jsonl(run_dir / RESULTS_FILE, row)
                rows.append(row)
            else:
                progress.update(bar, description=f"{task.name} #{problem.index} {problem.question[:30]}")
                solved = search_one(cfg, loaded, task, verifier, problem, policies)
                row, rt = solved.row, solved.rt
                if cfg.get("save_trees", True) or cfg.get("show_tree", False):
                    write_tree(run_dir, problem.index, solved.tree(problem))
                append_jsonl(run_dir / RESULTS_FILE, row)
                append_jsonl(run_dir / TRACES_FILE, {"index": problem.index, "trace": _trace(rt.metrics)})
                append_jsonl(run_dir / EVENTS_FILE, {"index": problem.index, "events": _events(rt)})
                rows.append(row)
            progress.advance(bar)
    return rows


def _unrun_row(problem: Problem, task: Task, loaded: LoadedModel, policy, why: str) -> dict[str, Any]:
    """The results row of a problem whose budget cannot hold its active path (not run: an OOM)."""
    return {
        "index": problem.index, "question": problem.question, "task": task.name, "model": loaded.spec,
        "solved": False, "oom": True, "error": why, "answer": None, "policy": policy.name,
        "budget_tokens": policy.budget_tokens, "peak_device_tokens": 0, "seconds": 0.0,
    }  # fmt: skip


class Solved(NamedTuple):
    """One searched problem: its results row, and the runtime, controller and result behind it."""

    row: dict[str, Any]
    rt: Runtime
    controller: Controller
    result: SearchResult | None  # None after an OOM

    def tree(self, problem: Problem) -> dict[str, Any]:
        """The search tree as a JSON-ready record (see :mod:`arbor_cli.tree_export`)."""
        best = self.result.best if self.result is not None else None
        held, info = held_nodes(self.controller), {"index": problem.index, "question": problem.question}
        return tree_record(self.rt, best, self.controller.expansions, held, **info)


def solve_one(
    cfg: DictConfig,
    loaded: LoadedModel,
    task: Task,
    verifier: Verifier,
    problem: Problem,
    policies: PolicyFactory | None = None,
) -> tuple[dict[str, Any], Runtime]:
    """One problem with a fresh runtime; an OOM is recorded, not raised."""
    solved = search_one(cfg, loaded, task, verifier, problem, policies)
    return solved.row, solved.rt


def search_one(
    cfg: DictConfig,
    loaded: LoadedModel,
    task: Task,
    verifier: Verifier,
    problem: Problem,
    policies: PolicyFactory | None = None,
) -> Solved:
    """:func:`solve_one`, also returning the controller and its result (for tree output)."""
    policy = (policies or PolicyFactory(cfg.policy, [problem])).build(problem.index)
    rt = Runtime(loaded, policy=policy, seed=int(cfg.seed) + problem.index)
    controller = instantiate(cfg.controller, runtime=rt, task=task, verifier=verifier)
    base = {"index": problem.index, "question": problem.question, "task": task.name, "model": loaded.spec}
    base["controller"] = getattr(controller, "name", type(controller).__name__)
    try:
        result = controller.solve(problem)
    except KVBudgetExceeded as exc:
        log.info("problem %s: %s", problem.index, exc)
        row = base | {"solved": False, "oom": True, "error": str(exc), "answer": None}
        row |= {"policy": policy.name, "budget_tokens": policy.budget_tokens}
        row |= _metric_fields(rt.metrics, controller.branch_switches, len(controller.expansions))
        return Solved(row, rt, controller, None)
    row = base | _result_fields(result) | {"oom": False, "error": None}
    row |= {"policy": policy.name, "budget_tokens": policy.budget_tokens}
    row |= _metric_fields(rt.metrics, result.branch_switches, len(result.expansions))
    return Solved(row, rt, controller, result)


def default_verifier(task: Task) -> Verifier:
    """The verifier a task uses unless the config names another."""
    if task.name == "game24":
        from verifiers.game24 import Game24Verifier

        return Game24Verifier()
    from verifiers.answer_match import AnswerVerifier

    return AnswerVerifier()


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


def write_summary_csv(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """All rows of the run as CSV (rewritten at the end of each run)."""
    path = run_dir / "results.csv"
    fields = sorted({k for row in rows for k in row if not isinstance(row[k], (list, dict))})
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _result_fields(result: SearchResult) -> dict[str, Any]:
    extra = {k: v for k, v in result.extra.items() if isinstance(v, (bool, int, float, str))}  # e.g. dfs backtracks
    return extra | {
        "solved": result.solved,
        "answer": result.answer,
        "steps": result.steps,
        "seconds": round(result.seconds, 3),
        "best_path": None if result.best is None else _path_text(result.best),
    }


def _metric_fields(m: RuntimeMetrics, switches: int, expansions: int) -> dict[str, Any]:
    fields = m.to_dict()
    fields.update(branch_switches=switches, nodes_expanded=expansions)
    fields.setdefault("seconds", round(m.runtime_seconds, 3))
    return fields


def _path_text(node) -> str:
    return "".join(n.text for n in node.path()[1:])


def _trace(metrics: RuntimeMetrics) -> list[dict[str, Any]]:
    return [asdict(p) for p in metrics.trace]


def _events(rt: Runtime) -> list[dict[str, Any]]:
    return [
        {"seq": r.seq, "step": r.step, "t": round(r.t, 4), "kind": r.kind, "resident_tokens": r.resident_tokens,
         "host_tokens": r.host_tokens, "plan_blocks": r.plan_blocks, **r.data}
        for r in rt.events.records
    ]  # fmt: skip


def _build(node: DictConfig) -> Any:
    """``instantiate`` that surfaces the target's own error (Hydra wraps it)."""
    try:
        return instantiate(node)
    except InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, USER_ERRORS):
            raise cause from None
        raise


def _model_kwargs(model_cfg: DictConfig) -> dict[str, Any]:
    keys = ("spec", "device", "dtype", "trust_remote_code")
    return {k: model_cfg.get(k) for k in keys if model_cfg.get(k) is not None}


def _choice(cfg: DictConfig, group: str) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group, group)
    except ValueError:
        return str(cfg.get(group, {}).get("_target_", group)).rsplit(".", 1)[-1]
