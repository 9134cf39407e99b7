"""Below the floor, replayed: teacher-forced fidelity of every memory policy at budgets under arbor's floor.

Reads the ``replay.jsonl`` files of ``scripts/replay_trace.py`` (recorded ``full`` searches rebuilt under
each policy at fractions of each tree's full peak; issue 44) and summarises, per task, policy and budget,
over the trees: top-1 agreement with full and mean KL(full || policy) per position, each a mean over
trees with its 95% Student-t interval; OOM runs; peak device tokens against the budget. Two more tables
compare policies on the same trees (paired: per-tree differences, their mean and 95% interval):
``vs_best``, arbor against the best tree-blind policy at each budget; ``vs_random``, every scorer against
the random baseline.

    python -m benchmarks.floor REPLAY_JSONL [REPLAY_JSONL ...] [--section floor] --command "..."
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.results.stats import mean_interval

#: tree-blind policies (arbor is compared with the best of them at each budget)
TREE_BLIND = ("random", "h2o", "streaming", "snapkv", "thinkv", "kvp")

#: the main table: (key, header, fmt)
COLUMNS = (
    ("task", "task", "text"), ("budget", "budget", "text"), ("policy", "policy", "text"), ("trees", "trees", "auto"),
    ("top1", "top-1 agreement [95% CI]", "text"), ("kl", "mean KL [95% CI]", "text"), ("oom", "OOM", "auto"),
    ("peak_x_budget", "peak / budget", "{:.2f}"), ("rehydrations", "rehydrations", "{:.1f}"),
)  # fmt: skip
PAIRED_COLUMNS = (
    ("task", "task", "text"), ("budget", "budget", "text"), ("policy", "policy", "text"),
    ("against", "against", "text"), ("trees", "trees", "auto"),
    ("top1_diff", "top-1 difference [95% CI]", "text"), ("kl_diff", "KL difference [95% CI]", "text"),
    ("beyond", "beyond the interval", "text"),
)  # fmt: skip


def read(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every row of the replay files (the per-step series dropped)."""
    rows = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append({k: v for k, v in json.loads(line).items() if k != "steps"})
    return rows


def by_setting(rows: Sequence[dict]) -> dict[tuple[str, float, str], dict[str, dict]]:
    """(task, budget fraction, policy) -> trace -> row, budgeted runs only (the unbounded reference is
    full itself: top-1 1, KL 0)."""
    out: dict[tuple[str, float, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r.get("budget_fraction") is None or r.get("budget_tokens") is None:
            continue
        out[(str(r["task"]), float(r["budget_fraction"]), str(r["policy"]))][str(r["trace"])] = r
    return out


def ci_text(values: list[float], digits: int = 3) -> str:
    mean, lo, hi = mean_interval(values)
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def kl_of(row: dict) -> float:
    return float(row["mean_kl"]) if row.get("mean_kl") is not None else float("nan")


def summary_rows(groups: dict[tuple[str, float, str], dict[str, dict]]) -> list[dict[str, Any]]:
    """The main table: one row per task, budget (large to small) and policy."""
    out = []
    for (task, frac, policy), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1], _order(kv[0][2]))):
        rows = list(runs.values())
        top1 = [float(r["top1_agreement"] or 0.0) for r in rows]
        kl = [kl_of(r) for r in rows]
        out.append({
            "task": task, "budget": f"{frac:g}x", "fraction": frac, "policy": policy, "trees": len(rows),
            "top1": ci_text(top1), "top1_mean": statistics.mean(top1),
            "kl": ci_text(kl), "kl_mean": statistics.mean(kl),
            "oom": sum(bool(r.get("oom")) for r in rows),
            "peak_x_budget": max(float(r["peak_device_tokens"] or 0) / float(r["budget_tokens"]) for r in rows),
            "rehydrations": statistics.mean(float(r.get("rehydrations") or 0) for r in rows),
        })  # fmt: skip
    return out


def paired(
    groups: dict[tuple[str, float, str], dict[str, dict]], task: str, frac: float, mine: str, theirs: str
) -> dict[str, Any] | None:
    """``mine`` minus ``theirs`` on the trees both replayed at this budget (top-1 and KL), with 95% intervals."""
    a, b = groups.get((task, frac, mine), {}), groups.get((task, frac, theirs), {})
    trees = sorted(set(a) & set(b))
    if not trees:
        return None
    d_top = [float(a[t]["top1_agreement"] or 0) - float(b[t]["top1_agreement"] or 0) for t in trees]
    d_kl = [kl_of(a[t]) - kl_of(b[t]) for t in trees]
    mean, lo, hi = mean_interval(d_top)
    beyond = "better" if lo > 0 else "worse" if hi < 0 else "no"
    return {
        "task": task, "budget": f"{frac:g}x", "fraction": frac, "policy": mine, "against": theirs,
        "trees": len(trees), "top1_diff": ci_text(d_top), "top1_diff_mean": mean, "kl_diff": ci_text(d_kl),
        "beyond": beyond,
    }  # fmt: skip


def versus_best(groups, summary: list[dict]) -> list[dict[str, Any]]:
    """Arbor against the tree-blind policy with the highest mean top-1 at each task and budget."""
    out = []
    for task, frac in dict.fromkeys((r["task"], r["fraction"]) for r in summary):
        blind = [r for r in summary if (r["task"], r["fraction"]) == (task, frac) and r["policy"] in TREE_BLIND]
        if not blind:
            continue
        best = max(blind, key=lambda r: r["top1_mean"])["policy"]
        row = paired(groups, task, frac, "arbor", best)
        if row is not None:
            out.append(row)
    return out


def versus_random(groups, summary: list[dict]) -> list[dict[str, Any]]:
    """Every other policy against ``random`` at each task and budget."""
    out = []
    for task, frac in dict.fromkeys((r["task"], r["fraction"]) for r in summary):
        for policy in [p for p in (*TREE_BLIND, "arbor") if p != "random"]:
            row = paired(groups, task, frac, policy, "random")
            if row is not None:
                out.append(row)
    return out


def facts(summary: list[dict], best: list[dict]) -> dict[str, Any]:
    """What the prose cites: arbor's OOMs, budgets where it is at least / beyond the best tree-blind."""
    arbor = [r for r in summary if r["policy"] == "arbor"]
    return {
        "arbor_oom": sum(r["oom"] for r in arbor),
        "arbor_runs": sum(r["trees"] for r in arbor),
        "arbor_at_least_best": sum(r["top1_diff_mean"] >= 0 for r in best),
        "arbor_beyond_best": sum(r["beyond"] == "better" for r in best),
        "arbor_below_best": sum(r["beyond"] == "worse" for r in best),
        "settings": len(best),
        "max_peak_x_budget": max((r["peak_x_budget"] for r in summary), default=None),
        "fractions": listed(sorted({r["fraction"] for r in summary}, reverse=True)),
    }


def listed(values: Sequence[float | str]) -> str:
    """``0.5, 0.25 and 0.1`` (numbers in their shortest form, words as they are)."""
    words = [v if isinstance(v, str) else f"{v:g}" for v in values]
    return ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1] if words else ""


def _order(policy: str) -> int:
    ranked = (*TREE_BLIND, "arbor")
    return ranked.index(policy) if policy in ranked else len(ranked)


@dataclass(frozen=True)
class ReplaySection:
    """What one replay summary writes: ``tables`` (name -> (columns spec, rows)) beside its summary rows,
    the lines it prints, and its facts."""

    summary: list[dict]
    columns: list[tuple[str, str, str]]
    tables: dict[str, tuple[list[tuple[str, str, str]], list[dict]]]
    facts: dict
    printed: list[tuple[list[dict], list[tuple[str, str, str]]]]


#: what a section keeps of each replay row (rows.jsonl): what the summaries read, and what names the row
ROW_FIELDS = (
    "task", "problem", "trace", "code", "policy", "budget_fraction", "budget_tokens", "oom", "error", "positions",
    "top1_agreement", "mean_kl", "rehydrations", "rehydrated_tokens", "recomputed_tokens", "evicted_tokens",
    "dropped_tokens", "peak_device_tokens", "seconds",
)  # fmt: skip


def section_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows a section commits (rows.jsonl): each replay row's :data:`ROW_FIELDS`, in file order."""
    return [{k: r.get(k) for k in ROW_FIELDS} for r in rows]


def replay_section_main(
    prog: str, title: str, summarise: Callable[[list[dict]], ReplaySection], argv: Sequence[str] | None
) -> int:
    """The command line of a summary of replay files (scripts/replay_trace.py): read them, summarise,
    print the summary's tables, and with ``--section`` write docs/data/<section>/results.json (the commit
    of the rows when they all ran at one) and rows.jsonl (every replay row's :data:`ROW_FIELDS`, so the
    tables can be recounted)."""
    from benchmarks.results.data import DATA, columns_spec, write_section_data

    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=title)
    ap.add_argument("replays", type=Path, nargs="+", help="replay.jsonl files of scripts/replay_trace.py")
    ap.add_argument("--section", default=None, help="write docs/data/<section>/results.json (else print only)")
    ap.add_argument("--title", default=title)
    ap.add_argument("--command", default="", help="the commands that made the replay files (recorded)")
    ap.add_argument("--setting", action="append", default=[], help="KEY=VALUE recorded in the section's settings")
    args = ap.parse_args(argv)
    rows = read(args.replays)
    out = summarise(rows)
    for printed, spec in out.printed:
        for r in printed:
            print(" | ".join(str(r[k]) if not isinstance(r[k], float) else f"{r[k]:.2f}" for k, _, _ in spec))
    if args.section:
        codes = sorted({str(r.get("code")) for r in rows if r.get("code")})
        settings = dict(s.split("=", 1) for s in args.setting)
        tables = {name: {"columns": columns_spec(spec), "rows": t} for name, (spec, t) in out.tables.items()}
        counts = Counter(str(r.get("code")) for r in rows if r.get("code"))
        extra = {"commit": codes[0]} if len(codes) == 1 else {"row_codes": dict(sorted(counts.items()))}
        extra = extra if codes else {}
        path = write_section_data(
            args.section, out.summary, args.command, settings, title=args.title, columns=columns_spec(out.columns),
            tables=tables, facts=out.facts, **extra,
        )  # fmt: skip
        (DATA / args.section / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in section_rows(rows)))
        print(f"wrote {path} and rows.jsonl")
    return 0


def summarise(rows: list[dict]) -> ReplaySection:
    """The floor section of replay rows: fidelity per policy and budget, against the best and against random."""
    groups = by_setting(rows)
    summary = summary_rows(groups)
    best, random = versus_best(groups, summary), versus_random(groups, summary)
    tables = {"vs_best": (PAIRED_COLUMNS, best), "vs_random": (PAIRED_COLUMNS, random)}
    return ReplaySection(summary, COLUMNS, tables, facts(summary, best), [(summary, COLUMNS), (best, PAIRED_COLUMNS)])


def main(argv: Sequence[str] | None = None) -> int:
    title = "Below the floor, replayed: fidelity to full per policy and budget"
    return replay_section_main("benchmarks.floor", title, summarise, argv)


if __name__ == "__main__":
    raise SystemExit(main())
