"""One problem's search, in a fresh runtime or in one that other searches share, into its record.

Every runner calls :func:`solve`: the local runner in this process (one at a time or in threads),
the Ray runner inside its actors.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any, NamedTuple

from arbor_cli.build import Setup
from arbor_cli.residency import ResidencyRecorder
from arbor_cli.runners.finished import Finished, keeps_trees, search_fields
from arbor_cli.tree_export import tree_record
from arbor_runtime import KVBudgetExceeded, Node, Runtime
from arbor_runtime.controllers.base import Controller, SearchResult
from arbor_runtime.events import EventLog
from arbor_runtime.metrics import RuntimeMetrics
from arbor_runtime.tasks.base import Problem

log = logging.getLogger(__name__)


def solve(setup: Setup, problem: Problem, shared: Runtime | None = None) -> Finished:
    """Search ``problem`` (in a fresh runtime, or in ``shared`` beside other searches) into its
    :class:`Finished` record; a shared runtime frees the problem's tree once it is recorded."""
    solved = search_one(setup, problem) if shared is None else search_shared(setup, shared, problem)
    try:
        tree = solved.tree(problem) if keeps_trees(setup) else None
        trace, events = _trace(solved.metrics), _events(solved.events)
        return Finished(problem.index, solved.row, trace, events, tree, solved.residency)
    finally:
        solved.done()


class Solved(NamedTuple):
    """One searched problem: its results row, the runtime, controller and result behind it, and the
    metrics and events that are its own (the runtime's, or its account's in a shared runtime)."""

    row: dict[str, Any]
    rt: Runtime
    controller: Controller
    result: SearchResult | None  # None after an OOM or an error
    metrics: RuntimeMetrics
    events: EventLog
    root: Node | None = None  # set in a shared runtime: released once the problem is recorded
    residency: dict[str, Any] | None = None  # the residency.jsonl line (arbor_cli.residency)
    shared: bool = False  # the runtime holds other problems' trees too

    def tree(self, problem: Problem) -> dict[str, Any]:
        """The search tree as a JSON-ready record (see :mod:`arbor_cli.tree_export`)."""
        best = self.result.best if self.result is not None else None
        info = {"index": problem.index, "question": problem.question}
        if self.shared and self.root is None:  # its prompt never made it into the store: no tree, and
            return tree_record(self.rt, None, (), root=None, guess_root=False, **info)  # not another's
        return tree_record(self.rt, best, self.controller.expansions, root=self.root, **info)

    def done(self) -> None:
        """The problem is recorded: a shared runtime frees its tree's KV (other trees keep theirs)."""
        if self.root is not None and not self.root.released:
            self.rt.release(self.root)


def search_one(setup: Setup, problem: Problem) -> Solved:
    """One problem with a fresh runtime and controller; an OOM is recorded in the row, not raised."""
    rt = setup.runtime(problem)
    controller = setup.controller(rt)
    with ResidencyRecorder(rt) as recorder:
        row, result = _search(setup, rt, controller, problem, rt.metrics, seed=None)
    return Solved(row, rt, controller, result, rt.metrics, rt.events, residency=recorder.record(problem.index))


def search_shared(setup: Setup, rt: Runtime, problem: Problem) -> Solved:
    """One problem in a runtime other searches share (its counts in its own account)."""
    with rt.account() as account, ResidencyRecorder(rt, account) as recorder:
        controller = setup.controller(rt)
        row, result = _search(setup, rt, controller, problem, account.metrics, seed=setup.seed(problem))
    root = controller.root
    residency = recorder.record(problem.index, tree_ids=[root.tree_id] if root is not None else [])
    return Solved(row, rt, controller, result, account.metrics, account.events, root, residency, shared=True)


def _search(setup: Setup, rt: Runtime, controller: Controller, problem: Problem, metrics, seed):
    """The search and its results row; an OOM or an error ends this problem only (recorded)."""
    base = {"index": problem.index, "question": problem.question, "task": setup.task.name, "model": setup.loaded.spec}
    base |= {"controller": controller.name, "policy": rt.policy.name, "budget_tokens": rt.budget_tokens}
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
