"""What each part of arbor buys: arbor's variants (one part switched off each) against its default, replayed.

Reads the ``replay.jsonl`` files of ``scripts/replay_trace.py`` run with arbor's variants in ``--policies``
(``arbor:msve=off``, ``arbor:topology=false``, ``arbor:extract=false``, ``arbor:host_tier=false``,
``arbor:pins=...``; docs/policies.md, "Arbor's parts") beside ``arbor`` and ``random``, and summarises per
task, budget and variant over the trees: top-1 agreement with full and mean KL(full || variant) per position,
rehydrated and recomputed tokens, and seconds. The paired table sets each variant against arbor's default on
the same trees (per-tree differences, their mean and 95% Student-t interval); a variant whose every tree
scored what the default scored is marked ``identical``.

    python -m benchmarks.ablation REPLAY_JSONL [REPLAY_JSONL ...] [--section ablation] --command "..."
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.floor import ReplaySection, by_setting, ci_text, kl_of, listed, replay_section_main
from benchmarks.results.stats import mean_interval

DEFAULT = "arbor"
#: variant names replay rows may carry for a switch renamed since (rows replayed at 8642720 say ``offload``)
RENAMED = {"arbor:offload=false": "arbor:host_tier=false"}
#: a KL difference this small is float rounding (a path read in another slot order), not a difference
KL_ROUNDING = 1e-6
#: the main table: (key, header, fmt)
COLUMNS = (
    ("task", "task", "text"), ("budget", "budget", "text"), ("policy", "variant", "text"),
    ("trees", "trees", "auto"), ("top1", "top-1 agreement [95% CI]", "text"), ("kl", "mean KL [95% CI]", "text"),
    ("rehydrated", "rehydrated tokens", "{:.0f}"), ("recomputed", "recomputed tokens", "{:.0f}"),
    ("seconds", "seconds", "{:.1f}"), ("oom", "OOM", "auto"),
)  # fmt: skip
PAIRED_COLUMNS = (
    ("task", "task", "text"), ("budget", "budget", "text"), ("policy", "variant", "text"),
    ("trees", "trees", "auto"), ("top1_diff", "top-1 - default [95% CI]", "text"),
    ("kl_diff", "KL - default [95% CI]", "text"), ("rehydrated_diff", "rehydrated tokens - default [95% CI]", "text"),
    ("seconds_ratio", "seconds / default", "{:.2f}"), ("verdict", "fidelity against the default", "text"),
    ("rehydrated_verdict", "tokens brought back", "text"),
)  # fmt: skip


def _mean(rows: list[dict], key: str) -> float:
    return statistics.mean(float(r.get(key) or 0.0) for r in rows)


def summary_rows(groups: dict[tuple[str, float, str], dict[str, dict]]) -> list[dict[str, Any]]:
    """One row per task, budget (large to small) and variant (the default and random first)."""
    out = []
    for (task, frac, policy), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1], _order(kv[0][2]))):
        rows = list(runs.values())
        top1, kl = [float(r["top1_agreement"] or 0.0) for r in rows], [kl_of(r) for r in rows]
        out.append({
            "task": task, "budget": f"{frac:g}x", "fraction": frac, "policy": policy, "trees": len(rows),
            "top1": ci_text(top1), "top1_mean": statistics.mean(top1),
            "kl": ci_text(kl), "kl_mean": statistics.mean(kl),
            "rehydrated": _mean(rows, "rehydrated_tokens"), "recomputed": _mean(rows, "recomputed_tokens"),
            "seconds": _mean(rows, "seconds"), "oom": sum(bool(r.get("oom")) for r in rows),
        })  # fmt: skip
    return out


def against_default(groups: dict[tuple[str, float, str], dict[str, dict]]) -> list[dict[str, Any]]:
    """Every variant (and random) minus arbor's default on the trees both replayed, per task and budget."""
    out = []
    for (task, frac, policy), mine in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1], _order(kv[0][2]))):
        base = groups.get((task, frac, DEFAULT), {})
        trees = sorted(set(mine) & set(base))
        if policy == DEFAULT or not trees:
            continue
        d_top = [float(mine[t]["top1_agreement"] or 0) - float(base[t]["top1_agreement"] or 0) for t in trees]
        d_kl = [kl_of(mine[t]) - kl_of(base[t]) for t in trees]
        d_reh = [
            float(mine[t].get("rehydrated_tokens") or 0) - float(base[t].get("rehydrated_tokens") or 0) for t in trees
        ]
        secs = sum(float(mine[t]["seconds"]) for t in trees) / max(sum(float(base[t]["seconds"]) for t in trees), 1e-9)
        out.append({
            "task": task, "budget": f"{frac:g}x", "fraction": frac, "policy": policy, "trees": len(trees),
            "top1_diff": ci_text(d_top), "kl_diff": ci_text(d_kl), "rehydrated_diff": ci_text(d_reh, 0),
            "seconds_ratio": secs,
            "verdict": verdict(d_top, d_kl), "rehydrated_verdict": cost_verdict(d_reh),
        })  # fmt: skip
    return out


def verdict(d_top: list[float], d_kl: list[float]) -> str:
    """``identical`` (every tree the same top-1 agreement and a KL within :data:`KL_ROUNDING` of the
    default's), ``worse`` / ``better`` (top-1 or KL beyond the 95% interval that way, neither the other
    way), ``mixed``, or ``no difference`` (within both intervals; also one tree, which has no interval)."""
    if all(abs(d) < 1e-12 for d in d_top) and all(abs(d) < KL_ROUNDING for d in d_kl):
        return "identical"
    if len(d_top) < 2:
        return "no difference"
    _, top_lo, top_hi = mean_interval(d_top)
    _, kl_lo, kl_hi = mean_interval(d_kl)
    worse = top_hi < 0 or kl_lo > 0
    better = top_lo > 0 or kl_hi < 0
    return "mixed" if worse and better else "worse" if worse else "better" if better else "no difference"


def cost_verdict(d_reh: list[float]) -> str:
    """Tokens brought back from the host against the default's: ``more`` / ``fewer`` beyond the 95% interval,
    ``same`` (every tree the same count), else ``no difference``."""
    if all(d == 0 for d in d_reh):
        return "same"
    if len(d_reh) < 2:
        return "no difference"
    _, lo, hi = mean_interval(d_reh)
    return "more" if lo > 0 else "fewer" if hi < 0 else "no difference"


def facts(
    groups: dict[tuple[str, float, str], dict[str, dict]], summary: list[dict], paired: list[dict]
) -> dict[str, Any]:
    """What the prose cites: trees per task, and per verdict the variants and budgets that got it."""
    variants = [r for r in paired if r["policy"] != "random"]
    trees: dict[str, set[str]] = {}
    for (task, _, _), runs in groups.items():
        trees.setdefault(task, set()).update(runs)
    out: dict[str, Any] = {
        "trees": listed([f"{len(names)} {task}" for task, names in sorted(trees.items())]),
        "fractions": listed(sorted({r["fraction"] for r in summary}, reverse=True)),
        # the budgets every variant and random ran at, and those only the variants acting on inactive blocks did
        "blind_fractions": listed(sorted({r["fraction"] for r in summary if r["policy"] == "random"}, reverse=True)),
        "room_fractions": listed(
            sorted(
                {r["fraction"] for r in summary} - {r["fraction"] for r in summary if r["policy"] == "random"},
                reverse=True,
            )
        ),
        "settings": len(variants),
        "default_oom": sum(r["oom"] for r in summary if r["policy"] == DEFAULT),
    }
    for word in ("identical", "no difference", "worse", "better", "mixed"):
        hits = [r for r in variants if r["verdict"] == word]
        out[word.replace(" ", "_")] = len(hits)
        out[f"{word.replace(' ', '_')}_where"] = listed(
            [f"{r['policy']} on {r['task']} at {r['budget']}" for r in hits]
        )
    for word in ("more", "fewer"):
        hits = [r for r in variants if r["rehydrated_verdict"] == word]
        out[f"rehydrates_{word}"] = len(hits)
        out[f"rehydrates_{word}_where"] = listed([f"{r['policy']} on {r['task']} at {r['budget']}" for r in hits])
    out["default_at_least_as_good"] = sum(r["verdict"] in ("identical", "no difference", "worse") for r in variants)
    return out


def _order(policy: str) -> tuple[int, str]:
    return (0 if policy == DEFAULT else 1 if policy == "random" else 2, policy)


def summarise(rows: list[dict]) -> ReplaySection:
    """The ablation section of replay rows: each variant's fidelity, and each against arbor's default."""
    groups = by_setting([r | {"policy": RENAMED.get(r["policy"], r["policy"])} for r in rows])
    summary, paired = summary_rows(groups), against_default(groups)
    tables = {"vs_default": (PAIRED_COLUMNS, paired)}
    return ReplaySection(summary, COLUMNS, tables, facts(groups, summary, paired), [(paired, PAIRED_COLUMNS)])


def main(argv: Sequence[str] | None = None) -> int:
    title = "What each part of arbor buys: its variants replayed against its default"
    return replay_section_main("benchmarks.ablation", title, summarise, argv)


if __name__ == "__main__":
    raise SystemExit(main())
