"""What each part of arbor buys, live: ``arbor-solve``'s own searches with one part switched off each.

The replayed ablation (:mod:`benchmarks.ablation`) rebuilds full's recorded trees teacher-forced; this
reads searches run through the console script a user runs (``scripts/bench_e2e.sh``: full's reference
with no budget, then arbor's variants and ``random`` at a ratio of each problem's full peak, set from the
start), where a part that changes what the model reads changes the search itself. Per variant: solved
and the same final answer as full (each with its 95% Wilson interval), the share of full's tree rebuilt,
tokens brought back from the host and recomputed, and model forwards (what a search costs whatever else
the machine ran: the sweeps run side by side, so their seconds are not compared). Then each variant
against arbor's default on the same problems: the per-problem differences in "same answer as full",
"solved" and "nodes as full", each mean with a 95% Student-t interval, and the exact sign test on the
problems where the answers' measures differ.

    python -m benchmarks.ablation_live FULL_RUN_DIR SWEEP_DIR [SWEEP_DIR ...] [--section ablation-live] \\
        --command "..."
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from arbor_cli.results import load_done, write_jsonl
from arbor_cli.sweep import find_jobs
from benchmarks.e2e import ROWS_FILE, measured_by, problem_rows, row_codes, weights_used
from benchmarks.floor import ci_text, listed
from benchmarks.results.stats import format_rate, mean_interval, sign_test

REPO = Path(__file__).resolve().parents[1]
DEFAULT = "arbor"
#: overrides that set the budget, not the variant
BUDGET_KEYS = ("policy.budget_ratio", "policy.budget_reference", "policy.reference_may_differ")
#: what a variant's rows keep of each problem besides :func:`benchmarks.e2e.problem_rows`' fields
COST_FIELDS = ("rehydrated_tokens", "recomputed_tokens", "forward_calls")
#: what a variant is judged on against the default, problem by problem
MEASURES = ("agree", "solved", "nodes_as_full")
COLUMNS = (
    ("policy", "variant", "text"), ("budget", "budget", "text"), ("problems", "n", "auto"),
    ("solved", "solved [95% CI]", "text"), ("agree", "same answer as full [95% CI]", "text"),
    ("nodes_as_full", "nodes as full", "{:.3f}"), ("rehydrated", "rehydrated tokens", "{:.0f}"),
    ("recomputed", "recomputed tokens", "{:.0f}"),
    ("forwards", "model forwards", "{:.1f}"), ("oom", "OOM", "auto"),
)  # fmt: skip
PAIRED_COLUMNS = (
    ("policy", "variant", "text"), ("problems", "n", "auto"),
    ("agree_diff", "same answer as full - default [95% CI]", "text"),
    ("agree_sign", "answers as full only here / only default (sign p)", "text"),
    ("solved_diff", "solved - default [95% CI]", "text"),
    ("solved_sign", "solved only here / only default (sign p)", "text"),
    ("nodes_as_full_diff", "nodes as full - default [95% CI]", "text"),
    ("forwards_ratio", "forwards / default", "{:.2f}"), ("verdict", "against the default", "text"),
)  # fmt: skip


# ---- reading the runs ---------------------------------------------------------------------------
def shipped(policy: str) -> dict[str, Any]:
    """A policy's shipped settings (conf/policy/<policy>.yaml), to name a variant by what it changes."""
    path = REPO / "conf" / "policy" / f"{policy}.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def variant_label(policy: str, overrides: dict[str, str]) -> str:
    """``arbor:topology=false`` from a job's overrides: the policy, then each ``policy.*`` override that
    differs from the shipped value, booleans as YAML writes them (an override that sets the shipped value,
    ``policy.msve=all``, is the default; the budget's keys name no variant)."""
    defaults = {k: str(v).lower() for k, v in shipped(policy).items()}
    parts = [
        f"{key.removeprefix('policy.')}={str(value).lower() if str(value) in ('True', 'False') else value}"
        for key, value in sorted(overrides.items())
        if key.startswith("policy.") and key not in BUDGET_KEYS
        and defaults.get(key.removeprefix("policy.")) != str(value).lower()
    ]  # fmt: skip
    return ":".join([policy, *parts])


def variant_runs(sweep_dirs: Iterable[Path]) -> list[tuple[str, float, Path]]:
    """(variant label, budget ratio, run dir) of every job of the sweeps, in the order they were swept."""
    out = []
    for sweep in sweep_dirs:
        for job in find_jobs(sweep):
            found = dict(job.overrides)
            ratio = found.get("policy.budget_ratio")
            if ratio is None:
                raise ValueError(f"{job.path}: no policy.budget_ratio override (not a budgeted sweep job)")
            policy = found.pop("policy", job.choices.get("policy", "full"))
            out.append((variant_label(policy, found), float(ratio), job.path))
    return out


def variant_problems(run_dir: Path, full_dir: Path, ref_rows: dict[int, dict]) -> list[dict[str, Any]]:
    """:func:`benchmarks.e2e.problem_rows` of one run, with its :data:`COST_FIELDS` (host, recompute, forwards)."""
    raw = load_done(run_dir)
    return [
        r | {k: int(raw[r["index"]].get(k) or 0) for k in COST_FIELDS}
        for r in problem_rows(run_dir, full_dir, ref_rows)
    ]


# ---- tables -------------------------------------------------------------------------------------
def budget_text(ratio: float | None) -> str:
    return "none" if ratio is None else f"{ratio:g}x full peak"


def summary_row(label: str, ratio: float | None, per: list[dict]) -> dict[str, Any]:
    """One variant's (or full's, ``ratio`` None) totals over its problems."""
    n = len(per)
    solved, agree = sum(r["solved"] for r in per), sum(r["agree"] for r in per)
    seconds = sorted(r["seconds"] for r in per)
    return {
        "policy": label, "budget": budget_text(ratio), "ratio": ratio, "problems": n,
        "solved": format_rate(solved, n), "solved_n": solved, "agree": format_rate(agree, n), "agree_n": agree,
        "nodes_as_full": statistics.mean(r["nodes_as_full"] for r in per),
        "below_floor": sum(r["budget_tokens"] is not None and r["floor_tokens"] is not None
                           and r["budget_tokens"] < r["floor_tokens"] for r in per),
        "rehydrated": statistics.mean(r["rehydrated_tokens"] for r in per),
        "recomputed": statistics.mean(r["recomputed_tokens"] for r in per),
        "forwards": statistics.mean(r["forward_calls"] for r in per), "p50_s": statistics.median(seconds),
        "oom": sum(r["oom"] for r in per),
    }  # fmt: skip


def _sign(mine: list[bool], base: list[bool]) -> tuple[int, int, float]:
    gained = sum(a and not b for a, b in zip(mine, base, strict=True))
    lost = sum(b and not a for a, b in zip(mine, base, strict=True))
    return gained, lost, sign_test(gained, lost)


def paired_row(label: str, mine: dict[int, dict], base: dict[int, dict]) -> dict[str, Any]:
    """One variant against the default on the problems both searched."""
    common = sorted(mine.keys() & base.keys())
    if not common:
        raise ValueError(f"{label}: no problem in common with arbor's default")
    out: dict[str, Any] = {"policy": label, "problems": len(common)}
    for key in ("agree", "solved"):
        a, b = [bool(mine[i][key]) for i in common], [bool(base[i][key]) for i in common]
        gained, lost, p = _sign(a, b)
        diffs = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
        mean, lo, hi = mean_interval(diffs)
        out |= {
            f"{key}_diff": ci_text(diffs, 2), f"{key}_mean": mean, f"{key}_lo": lo, f"{key}_hi": hi,
            f"{key}_gained": gained, f"{key}_lost": lost, f"{key}_p": p,
            f"{key}_sign": f"+{gained} / -{lost} (p {p:.2g})",
        }  # fmt: skip
    nodes = [mine[i]["nodes_as_full"] - base[i]["nodes_as_full"] for i in common]
    mean, lo, hi = mean_interval(nodes)
    out |= {"nodes_as_full_diff": ci_text(nodes, 3), "nodes_as_full_mean": mean, "nodes_as_full_lo": lo}
    out |= {"nodes_as_full_hi": hi}
    forwards = sum(mine[i]["forward_calls"] for i in common) / max(sum(base[i]["forward_calls"] for i in common), 1)
    same = all(mine[i]["answer"] == base[i]["answer"] for i in common)
    return out | {"forwards_ratio": forwards, "same_answers": same, "verdict": verdict(out, same)}


def verdict(row: dict[str, Any], same_answers: bool) -> str:
    """``identical`` (every problem the default's answer), ``worse`` / ``better`` (same answer as full,
    solved or nodes as full beyond its 95% interval that way and none the other way), ``mixed``, or
    ``no difference``."""
    if same_answers:
        return "identical"
    worse = any(row[f"{key}_hi"] < 0 for key in MEASURES)
    better = any(row[f"{key}_lo"] > 0 for key in MEASURES)
    return "mixed" if worse and better else "worse" if worse else "better" if better else "no difference"


def _order(label: str) -> tuple[int, str]:
    return (0 if label == DEFAULT else 1 if label == "random" else 2, label)


def build(full_dir: Path, sweep_dirs: Sequence[Path]) -> dict[str, Any]:
    """Summary rows (full's first), paired rows, facts and per-problem rows of the runs."""
    ref_rows = load_done(full_dir)
    runs = sorted(variant_runs(sweep_dirs), key=lambda r: (-r[1], _order(r[0])))
    per: dict[tuple[str, float | None], list[dict]] = {("full", None): variant_problems(full_dir, full_dir, ref_rows)}
    per |= {(label, ratio): variant_problems(path, full_dir, ref_rows) for label, ratio, path in runs}
    summary = [summary_row(label, ratio, rows) for (label, ratio), rows in per.items()]
    paired = []
    for (label, ratio), rows in per.items():
        base = per.get((DEFAULT, ratio))
        if label not in (DEFAULT, "full") and base is not None:
            paired.append(paired_row(label, {r["index"]: r for r in rows}, {r["index"]: r for r in base}))
    problem_lines = [
        {"policy": label, "budget": budget_text(ratio)} | r for (label, ratio), rows in per.items() for r in rows
    ]
    return {"summary": summary, "paired": paired, "facts": facts(summary, paired), "rows": problem_lines}


def facts(summary: list[dict], paired: list[dict]) -> dict[str, Any]:
    """What the prose cites: problems, budgets, the default's rates, and per verdict the variants."""
    default = [r for r in summary if r["policy"] == DEFAULT]
    full = next(r for r in summary if r["policy"] == "full")
    variants = [r for r in paired if r["policy"] != "random"]
    out: dict[str, Any] = {
        "problems": listed(sorted({r["problems"] for r in summary})),
        "budgets": listed([f"{x:g}x" for x in sorted({r["ratio"] for r in summary if r["ratio"]}, reverse=True)]),
        "default_below_floor": listed([r["below_floor"] for r in default]),
        "full_solved": full["solved"],
        "default_agree": listed([r["agree"] for r in default]),
        "default_solved": listed([r["solved"] for r in default]),
        "settings": len(variants),
        "default_at_least_as_good": sum(r["verdict"] != "better" for r in variants),
    }
    for word in ("identical", "no difference", "worse", "better", "mixed"):
        hits = [r["policy"] for r in variants if r["verdict"] == word]
        out[word.replace(" ", "_")] = len(hits)
        out[f"{word.replace(' ', '_')}_where"] = listed(hits) or "none"
    rand = [r for r in paired if r["policy"] == "random"]
    out["random_verdict"] = rand[0]["verdict"] if rand else "not run"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.results.data import columns_spec, write_section_data

    ap = argparse.ArgumentParser(prog="python -m benchmarks.ablation_live", description=__doc__.split("\n")[0])
    ap.add_argument("full", type=Path, help="the reference run dir (policy=full, no budget)")
    ap.add_argument("sweeps", type=Path, nargs="+", help="Hydra sweep dirs of arbor's variants (and random)")
    ap.add_argument("--section", default=None, help="write docs/data/<section>/results.json (else print only)")
    ap.add_argument("--title", default="What each part of arbor buys, live: arbor-solve at a fixed budget")
    ap.add_argument("--command", default="", help="the commands that made the run dirs (recorded)")
    ap.add_argument("--setting", action="append", default=[], help="KEY=VALUE recorded in the section's settings")
    args = ap.parse_args(argv)
    try:
        for path in (args.full, *args.sweeps):
            if not path.is_dir():
                raise FileNotFoundError(f"{path}: no such folder")
        if not load_done(args.full):
            raise ValueError(f"{args.full}: no finished problem in its results.jsonl (an arbor-solve run dir?)")
        out = build(args.full, args.sweeps)
    except (OSError, ValueError, KeyError) as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    for rows, spec in ((out["summary"], COLUMNS), (out["paired"], PAIRED_COLUMNS)):
        for r in rows:
            print(" | ".join(str(r[k]) if not isinstance(r[k], float) else f"{r[k]:.2f}" for k, _, _ in spec))
    if args.section:
        dirs = [args.full] + [path for *_, path in variant_runs(args.sweeps)]
        settings = {"weights": weights_used(dirs)} | dict(s.split("=", 1) for s in args.setting)
        tables = {"vs_default": {"columns": columns_spec(PAIRED_COLUMNS), "rows": out["paired"]}}
        path = write_section_data(
            args.section, out["summary"], args.command, settings, title=args.title, columns=columns_spec(COLUMNS),
            tables=tables, facts=out["facts"], **measured_by(row_codes(dirs)),
        )  # fmt: skip
        write_jsonl(path.with_name(ROWS_FILE), out["rows"])  # every table above recounts from these
        print(f"wrote {path} and {ROWS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
