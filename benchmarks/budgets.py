"""Live searches at shrinking budgets: where each policy stops being exact, and what it costs in time.

For one problem, the search runs once under ``full`` with no budget (the reference: its tree, its
peak device KV, its wall time), then again under each policy at budgets that are fractions of that
peak, plus the *floor*: the longest path the search ever extended plus one thought of
``max_thought_tokens``, below which no policy that keeps the active path whole can run one row.
Every row samples from its own stream, so a run whose context is exact rebuilds the reference
tree token for token however its rows were batched; a row of the table says whether it did
(``same_tree``), the largest log-probability difference, and the wall-time ratio to the reference
(sub-batching, preemption and rehydration trade time for memory).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arbor_runtime import BudgetError, KVBudgetExceeded, Runtime
from arbor_runtime.policies import build_policy
from arbor_runtime.tree import GENERATED, Node


@dataclass(slots=True)
class SearchRun:
    """One live search: its tree (node id -> tokens, log-probs), memory metrics, time, OOM."""

    policy: str
    budget: int | None
    nodes: dict[int, tuple[list[int], list[float]]]
    metrics: dict[str, Any]
    seconds: float
    oom: str | None
    solved: bool | None

    def compare(self, ref: SearchRun) -> dict[str, Any]:
        """Same tree as ``ref`` (every node's tokens), and the largest log-prob gap on shared nodes."""
        common = self.nodes.keys() & ref.nodes.keys()
        gap = 0.0
        for i in common:
            a, b = self.nodes[i][1], ref.nodes[i][1]
            if self.nodes[i][0] == ref.nodes[i][0] and a and b:
                gap = max(gap, max(abs(x - y) for x, y in zip(a, b, strict=True)))
        same = self.oom is None and self.nodes.keys() == ref.nodes.keys()
        same = same and all(self.nodes[i][0] == ref.nodes[i][0] for i in common)
        return {"same_tree": same, "max_logprob_gap": gap}


def run_search(loaded, make_controller, problem, policy: str, budget: int | None, seed: int) -> SearchRun:
    """Solve ``problem`` with a fresh runtime under ``policy`` at ``budget``; an OOM is recorded."""
    rt = Runtime(loaded, policy=build_policy(policy, budget_tokens=budget), seed=seed)
    start, oom, solved = time.perf_counter(), None, None
    try:
        solved = bool(make_controller(rt).solve(problem, seed=seed).solved)
    except (KVBudgetExceeded, BudgetError) as exc:  # a budget below the prompt is refused up front
        oom = str(exc)
    seconds = time.perf_counter() - start
    nodes = {i: (list(n.token_ids), list(n.logprobs)) for i, n in rt.all_nodes.items()}
    return SearchRun(policy, budget, nodes, rt.metrics.to_dict(), seconds, oom, solved)


def floor_tokens(nodes: Sequence[Node], new_tokens: int) -> int:
    """Least budget one row can run at: the longest path extended plus one thought in flight."""
    need = 0
    for node in nodes:
        path = sum(n.length for n in node.path())
        need = max(need, path - node.length + new_tokens if node.kind == GENERATED else path)
    return need


def budget_rows(
    loaded, make_controller, problem, policies: Sequence[str], fractions: Sequence[float], new_tokens: int, seed: int
) -> list[dict[str, Any]]:
    """The reference run, then every policy at every budget; one dict per run."""
    ref_rt = Runtime(loaded, policy="full", seed=seed)
    start = time.perf_counter()
    solved = bool(make_controller(ref_rt).solve(problem, seed=seed).solved)
    ref = SearchRun(
        "full",
        None,
        {i: (list(n.token_ids), list(n.logprobs)) for i, n in ref_rt.all_nodes.items()},
        ref_rt.metrics.to_dict(),
        time.perf_counter() - start,
        None,
        solved,
    )
    peak = int(ref.metrics["peak_device_tokens"])
    floor = floor_tokens(list(ref_rt.all_nodes.values()), new_tokens)
    budgets = sorted({math.ceil(f * peak) for f in fractions} | {floor}, reverse=True)
    rows = [_row(problem, ref, ref, peak, floor)]
    for policy in policies:
        for budget in budgets:
            run = run_search(loaded, make_controller, problem, policy, budget, seed)
            rows.append(_row(problem, run, ref, peak, floor))
    return rows


def _row(problem, run: SearchRun, ref: SearchRun, peak: int, floor: int) -> dict[str, Any]:
    m = run.metrics
    return {
        "problem": problem.index,
        "policy": run.policy,
        "budget": run.budget,
        "fraction": None if run.budget is None else round(run.budget / peak, 3),
        "full_peak": peak,
        "floor": floor,
        "floor_fraction": round(floor / peak, 3),
        "oom": run.oom is not None,
        **run.compare(ref),
        "nodes": len(run.nodes),
        "solved": run.solved,
        "seconds": round(run.seconds, 2),
        "time_vs_full": round(run.seconds / ref.seconds, 2),
        "peak_device_tokens": m["peak_device_tokens"],
        "peak_device_mb": round(m["peak_device_bytes"] / 2**20, 2),
        "pool_mb": round(m["pool_bytes"] / 2**20, 2),
        "rehydrations": m["rehydrations"],
        "recomputed_tokens": m["recomputed_tokens"],
        "preemptions": m["preemptions"],
        "forward_calls": m["forward_calls"],
        "peak_host_mb": round(m["peak_host_bytes"] / 2**20, 2),
    }


# ---- script ---------------------------------------------------------------------------------
def budgets_main(argv: Sequence[str] | None = None) -> int:
    """``bench_budgets.py``: live searches under each policy at shrinking budgets; table + JSONL + CSV."""
    import argparse
    import sys
    from pathlib import Path

    import torch
    from rich.console import Console

    from arbor_cli.build import USER_ERRORS, build, compose_config
    from arbor_cli.results import write_csv, write_jsonl
    from benchmarks.cli import parse_floats, policy_names

    ap = argparse.ArgumentParser(prog="bench_budgets.py", description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default="arbor", help="comma-separated policy names")
    ap.add_argument("--fractions", default="0.75,0.5,0.35,0.25", help="budgets as shares of full's peak")
    ap.add_argument("--out", default="bench/budgets", help="folder for budgets.jsonl and budgets.csv")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("overrides", nargs="*", help="arbor-solve overrides (task=, controller=, model=...)")
    args = ap.parse_args(argv)
    console = Console(width=200)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        policies, fractions = policy_names(args.policies), parse_floats(args.fractions, "--fractions")
        setup = build(compose_config(args.overrides))
        rows = []
        for problem in setup.problems:
            seed = setup.seed(problem)
            new_tokens = setup.task.max_thought_tokens
            mine = budget_rows(setup.loaded, setup.controller, problem, policies, fractions, new_tokens, seed)
            rows += [{"task": setup.task.name} | r for r in mine]
            console.print(_table(mine, f"budgets · {setup.task.name} #{problem.index}"))
    except USER_ERRORS as exc:
        print(f"bench_budgets.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    write_jsonl(out / "budgets.jsonl", rows)
    write_csv(out / "budgets.csv", rows)
    console.print(f"wrote {out / 'budgets.jsonl'} and {out / 'budgets.csv'}")
    return 0


#: columns of the console table (every field is in the JSONL / CSV)
TABLE_COLUMNS = (
    "policy", "budget", "fraction", "oom", "same_tree", "max_logprob_gap",
    "time_vs_full", "preemptions", "rehydrations", "peak_device_mb",
)  # fmt: skip


def _table(rows, title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*[_cell(r[c]) for c in TABLE_COLUMNS])
    return table


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2g}" if isinstance(value, float) else str(value)
