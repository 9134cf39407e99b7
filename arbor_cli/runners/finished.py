"""The record every runner yields for a problem, as plain JSON-able data; only the driver writes it.

A runner searches problems where it likes (this process, threads, Ray actors on other hosts) and
hands back :class:`Finished` records; :func:`arbor_cli.run.solve_all` alone appends them to the
run dir, so each problem is written exactly once whichever runner searched it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from arbor_cli.provenance import code_version

if TYPE_CHECKING:
    from arbor_cli.build import Setup
    from arbor_runtime.tasks.base import Problem


@dataclass(slots=True)
class Finished:
    """One searched (or failed) problem: its results row, memory trace, event log, and its tree
    record when trees are kept. Plain data only, so it crosses process and host boundaries.

    Attributes:
        index: the problem's index in its data set.
        row: the ``results.jsonl`` row.
        trace: the per-step memory trace (``traces.jsonl``).
        events: the runtime's event log (``events.jsonl``).
        tree: the search tree (:func:`arbor_cli.tree_export.tree_record`), or None when not kept.
        residency: per-block residency deltas (``residency.jsonl``, :mod:`arbor_cli.residency`), or None.
    """

    index: int
    row: dict[str, Any]
    trace: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    tree: dict[str, Any] | None = None
    residency: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as a dict of JSON-able values (what a remote worker sends back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finished:
        """The record back from :meth:`to_dict`."""
        return cls(**data)


def unrun_row(setup: Setup, problem: Problem, why: str, oom: bool) -> dict[str, Any]:
    """The results row of a problem that was not searched: its budget cannot hold its active path
    (``oom``), or every worker that tried it died (an error)."""
    policy = setup.policies.build(problem.index)
    return {
        "index": problem.index, "question": problem.question, "task": setup.task.name, "model": setup.loaded.spec,
        "solved": False, "oom": oom, "error": why, "answer": None, "policy": policy.name,
        "budget_tokens": policy.budget_tokens, "peak_device_tokens": 0, "seconds": 0.0, **search_fields(setup),
    }  # fmt: skip


def search_fields(setup: Setup) -> dict[str, Any]:
    """What scored and proposed the search: every row records its verifier (an oracle's label too),
    for tasks with propose modes the mode, the model's weight format, the code that ran it
    (:func:`code_version`) and, for a policy that evicts tokens, its ``granularity``."""
    fields = {"verifier": setup.verifier.name, "weights": setup.loaded.weights, "code": code_version()}
    if setup.verifier.label:
        fields["verifier_label"] = setup.verifier.label
    if hasattr(setup.task, "propose_mode"):
        fields["propose"] = setup.task.propose_mode
    cfg = getattr(setup, "cfg", None)  # a scheduler's stand-in setup carries no config
    granularity = (cfg.get("policy") or {}).get("granularity") if cfg is not None else None
    if granularity is not None:  # whole tokens or per (layer, KV head): two runs of a policy differ by it
        fields["granularity"] = granularity
    return fields


def keeps_trees(setup: Setup) -> bool:
    """Whether a run keeps each problem's tree (``save_trees``, or ``show_tree`` to print it)."""
    return bool(setup.cfg.get("save_trees", True) or setup.cfg.get("show_tree", False))
