"""Policy construction for a run: absolute or relative KV budgets, checked before any work."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from arbor_cli.results import RESULTS_FILE, load_done
from arbor_runtime import BudgetError
from tasks.base import Problem, Task

#: keys of conf/policy/*.yaml that the CLI consumes (not fields of the policy classes)
RUN_KEYS = ("budget_ratio", "budget_reference")


class PolicyFactory:
    """Builds one policy per problem, resolving ``policy.budget_ratio`` against a reference run.

    ``budget_ratio`` x (peak device KV tokens `full` needed on the same problem, read from the
    ``budget_reference`` run's results.jsonl) becomes that problem's ``budget_tokens``.
    """

    def __init__(self, policy_cfg: DictConfig, problems: list[Problem]) -> None:
        node = OmegaConf.to_container(policy_cfg, resolve=True)
        self.ratio = node.pop("budget_ratio", None)
        reference = node.pop("budget_reference", None)
        self.node = node
        self.peaks: dict[int, int] = {}
        if self.ratio is not None:
            self.peaks = _reference_peaks(float(self.ratio), reference, problems)
        self.build(problems[0].index if problems else None)  # validates fields now, before any work

    def build(self, index: int | None) -> Any:
        node = dict(self.node)
        if self.ratio is not None and index is not None:
            node["budget_tokens"] = max(1, int(float(self.ratio) * self.peaks[index]))
        try:
            return instantiate(node)
        except InstantiationException as exc:
            raise (exc.__cause__ or exc) from None

    def budget_for(self, index: int) -> int | None:
        return self.build(index).budget_tokens


def check_budget(factory: PolicyFactory, task: Task, problems: list[Problem], tokenizer) -> dict[int, str]:
    """Budgets smaller than the least a problem's active path needs: its prompt plus one thought of
    ``max_thought_tokens`` in flight. (Deeper paths need more; running out then is an OOM.) Policies
    that may shrink the active path (h2o, streaming, thinkv) prefill a longer prompt in chunks, so
    they need room for one thought and one prompt token only.

    An absolute ``budget_tokens`` that is too small for any problem fails up front (BudgetError).
    Budgets derived per problem from ``budget_ratio`` are results, not input errors: the problems
    they cannot serve are returned (index -> message) and recorded as OOM without being run.
    """
    infeasible = {}
    for problem in problems:
        policy = factory.build(problem.index)
        budget = policy.kv_budget_tokens  # less a sparse index's reserve (lychee, quest)
        if budget is None:
            continue
        prompt = 1 if policy.shrinks_active_path else len(tokenizer(task.prompt(problem))["input_ids"])
        need = prompt + task.max_thought_tokens
        if budget < need:
            what = "one prompt token (it is prefilled in chunks)" if policy.shrinks_active_path else f"prompt {prompt}"
            reserve = policy.budget_tokens - budget
            kv = f" ({budget} for KV after the index reserve)" if reserve else ""
            infeasible[problem.index] = (
                f"policy.budget_tokens={policy.budget_tokens}{kv} is smaller than the active path of problem "
                f"{problem.index} needs: {what} + one thought of {task.max_thought_tokens} tokens = {need}; "
                f"use a budget >= {_with_reserve(need, getattr(policy, 'index_reserve', 0.0))}"
            )
    if infeasible and factory.ratio is None:
        raise BudgetError(next(iter(infeasible.values())))
    return infeasible


def _with_reserve(need: int, share: float) -> int:
    """The least budget that leaves ``need`` KV tokens after reserving ``ceil(share * budget)``."""
    budget = need
    while budget - math.ceil(share * budget) < need:
        budget += 1
    return budget


def _reference_peaks(ratio: float, reference: str | None, problems: list[Problem]) -> dict[int, int]:
    if ratio <= 0:
        raise ValueError(f"policy.budget_ratio={ratio} must be > 0")
    if not reference:
        raise ValueError("policy.budget_ratio needs policy.budget_reference=<run dir or results.jsonl of a full run>")
    path = Path(reference).expanduser()
    run_dir = path.parent if path.name == RESULTS_FILE else path
    if not (run_dir / RESULTS_FILE).is_file():
        raise FileNotFoundError(f"policy.budget_reference={reference!r} has no {RESULTS_FILE}")
    rows = load_done(run_dir)
    missing = [p.index for p in problems if p.index not in rows or rows[p.index].get("oom")]
    if missing:
        raise ValueError(f"policy.budget_reference={reference!r} lacks a finished (non-OOM) run of problems {missing}")
    return {p.index: int(rows[p.index]["peak_device_tokens"]) for p in problems}
