"""Per-head retention below the floor (issue 66, item 4c): every policy at both granularities, replayed.

Reads the ``replay.jsonl`` files of ``scripts/replay_trace.py`` run with each policy and its per-head variant
(``h2o`` and ``h2o:granularity=head``, ...) in ``--policies``, and summarises per task, budget and variant
over the trees: top-1 agreement with full and mean KL(full || policy) per position (as the ablation does).
The paired table sets each per-head variant against the same policy at whole tokens on the same trees
(per-tree differences, their mean and 95% Student-t interval; ``identical`` when every tree scored the
same); the best table names, per task and budget, the tree-blind variant with the lowest mean KL and kvp
per head's rank among the tree-blind variants.

    python -m benchmarks.per_head_replay REPLAY_JSONL [REPLAY_JSONL ...] [--section per-head-replay] --command "..."
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.ablation import COLUMNS, cost_verdict, summary_rows, verdict
from benchmarks.floor import ReplaySection, by_setting, ci_text, kl_of, replay_section_main

HEAD = ":granularity=head"
TREE_BLIND = ("random", "h2o", "snapkv", "kvp", "thinkv", "streaming")
PAIRED_COLUMNS = (
    ("task", "task", "text"), ("budget", "budget", "text"), ("policy", "policy", "text"),
    ("trees", "trees", "auto"), ("top1_diff", "top-1 head - token [95% CI]", "text"),
    ("kl_diff", "KL head - token [95% CI]", "text"), ("verdict", "per head against whole tokens", "text"),
    ("rehydrated_verdict", "tokens brought back", "text"),
)  # fmt: skip
BEST_COLUMNS = (
    ("task", "task", "text"), ("budget", "budget", "text"), ("best", "lowest mean KL (tree-blind)", "text"),
    ("best_kl", "its KL", "{:.4f}"), ("kvp_head_kl", "kvp per head", "{:.4f}"),
    ("kvp_head_rank", "kvp per head's rank", "auto"), ("variants", "tree-blind variants", "auto"),
)  # fmt: skip


def head_against_token(groups: dict[tuple[str, float, str], dict[str, dict]]) -> list[dict[str, Any]]:
    """Every ``NAME:granularity=head`` minus ``NAME`` on the trees both replayed, per task and budget."""
    out = []
    for (task, frac, policy), mine in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
        if not policy.endswith(HEAD):
            continue
        base = groups.get((task, frac, policy.removesuffix(HEAD)), {})
        trees = sorted(set(mine) & set(base))
        if not trees:
            continue
        d_top = [float(mine[t]["top1_agreement"] or 0) - float(base[t]["top1_agreement"] or 0) for t in trees]
        d_kl = [kl_of(mine[t]) - kl_of(base[t]) for t in trees]
        d_reh = [
            float(mine[t].get("rehydrated_tokens") or 0) - float(base[t].get("rehydrated_tokens") or 0) for t in trees
        ]
        out.append({
            "task": task, "budget": f"{frac:g}x", "fraction": frac, "policy": policy.removesuffix(HEAD),
            "trees": len(trees), "top1_diff": ci_text(d_top), "kl_diff": ci_text(d_kl),
            "verdict": verdict(d_top, d_kl), "rehydrated_verdict": cost_verdict(d_reh),
        })  # fmt: skip
    return out


def best_tree_blind(groups: dict[tuple[str, float, str], dict[str, dict]]) -> list[dict[str, Any]]:
    """Per task and budget: the tree-blind variant with the lowest mean KL over the trees, kvp per head's rank."""
    out = []
    for task, frac in sorted({(t, f) for t, f, _ in groups}, key=lambda k: (k[0], -k[1])):
        means = {
            p: statistics.mean(kl_of(r) for r in runs.values())
            for (t, f, p), runs in groups.items()
            if (t, f) == (task, frac) and p.removesuffix(HEAD) in TREE_BLIND and runs
        }
        ranked = sorted(means, key=means.get)
        kvp = "kvp" + HEAD
        out.append({
            "task": task, "budget": f"{frac:g}x", "fraction": frac, "best": ranked[0], "best_kl": means[ranked[0]],
            "kvp_head_kl": means.get(kvp), "kvp_head_rank": ranked.index(kvp) + 1 if kvp in means else None,
            "variants": len(ranked),
        })  # fmt: skip
    return out


def facts(paired: list[dict], best: list[dict]) -> dict[str, Any]:
    """Per verdict, how many (task, budget, policy) cells per head has it; where kvp per head is the best."""
    out: dict[str, Any] = {"cells": len(paired), "trees_min": min((r["trees"] for r in paired), default=0)}
    for v in ("identical", "better", "no difference", "worse", "mixed"):
        out[v.replace(" ", "_")] = sum(1 for r in paired if r["verdict"] == v)
    worse = [f"{r['policy']} {r['task']} {r['budget']}" for r in paired if r["verdict"] == "worse"]
    out["worse_cells"] = "; ".join(worse) or "none"
    out["kvp_head_best"] = sum(1 for r in best if r["best"] == "kvp" + HEAD)
    out["best_cells"] = len(best)
    return out


def summarise(rows: list[dict]) -> ReplaySection:
    groups = by_setting(rows)
    summary = summary_rows(groups)
    paired, best = head_against_token(groups), best_tree_blind(groups)
    tables = {"head_vs_token": (PAIRED_COLUMNS, paired), "best": (BEST_COLUMNS, best)}
    out = facts(paired, best)
    trees: dict[str, set] = {}
    for (task, _, _), runs in groups.items():
        trees.setdefault(task, set()).update(runs)
    out["trees"] = ", ".join(f"{len(t)} {task}" for task, t in sorted(trees.items()))
    out["fractions"] = ", ".join(f"{f:g}x" for f in sorted({f for _, f, _ in groups}, reverse=True))
    return ReplaySection(summary, list(COLUMNS), tables, out, [(paired, PAIRED_COLUMNS)])


def main(argv: Sequence[str] | None = None) -> int:
    title = "Per-head retention below the floor: every policy at both granularities, replayed"
    return replay_section_main("benchmarks.per_head_replay", title, summarise, argv)


if __name__ == "__main__":
    raise SystemExit(main())
