"""Which KVP weights ship: two trained losses side by side on held-out contexts, paired per context.

Issue 66 asks to ship whichever loss trains the best held-out AUC and KL. The KVP section's benchmark ran
four contexts, too few to separate two losses whose mean KL differs by a few hundredths. This reads
``scripts/bench_kvp.py`` outputs (one per protocol: ``compress`` and ``budget``) in which each loss ran as a
``--variants`` entry at both retention granularities (``NAME@token=WEIGHTS`` and ``NAME@head=WEIGHTS``),
and pairs the candidate with the incumbent on every context: per (protocol, granularity, kept share), the
mean over contexts of the candidate's mean KL minus the incumbent's, with its 95% Student-t interval, the
contexts where the candidate is lower, and top-1. Each weights file's own held-out AUC (recorded by
``kvp_train.py`` in its metadata) sits beside.

Decision rule, fixed before the runs: the candidate ships when its held-out per-head AUC is at least the
incumbent's and it is lower beyond the interval in more (protocol, granularity, share) cells than it is
higher beyond it; otherwise the incumbent stays.

    python -m benchmarks.kvp_loss BENCH_JSON [BENCH_JSON ...] --weights kvp=PATH --weights budgets=PATH \\
        --candidate budgets [--incumbent kvp] [--section kvp-loss --command "..."]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arbor_runtime.policies.scorer import GRANULARITIES
from benchmarks.floor import ci_text, listed
from benchmarks.results.stats import mean_interval

COLUMNS = (
    ("protocol", "protocol", "text"), ("granularity", "retention", "text"), ("kept", "kept", "text"),
    ("contexts", "n", "auto"), ("incumbent_kl", "incumbent KL", "{:.4f}"), ("candidate_kl", "candidate KL", "{:.4f}"),
    ("diff", "candidate - incumbent [95% CI]", "text"), ("lower", "contexts lower", "text"),
    ("incumbent_top1", "incumbent top-1", "{:.3f}"), ("candidate_top1", "candidate top-1", "{:.3f}"),
    ("verdict", "candidate", "text"),
)  # fmt: skip
AUC_COLUMNS = (
    ("loss", "loss", "text"), ("head_auc", "held-out AUC per head", "{:.4f}"),
    ("token_auc", "held-out AUC whole tokens", "{:.4f}"), ("train_tokens", "training context tokens", "auto"),
    ("seconds", "training s", "{:.0f}"),
)  # fmt: skip


def context_rows(bench: dict[str, Any], losses: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (context, loss, granularity, kept share) of one bench_kvp.py output: mean KL and top-1
    over the continuation's steps. Raises when a loss at a granularity did not run."""
    rows = []
    for ctx in bench["per_context"]:
        ran = {r["policy"] for r in ctx["runs"]}
        missing = [f"{loss}@{g}" for loss in losses for g in GRANULARITIES if f"{loss}@{g}" not in ran]
        if missing:
            raise ValueError(f"{ctx['name']} ({bench['protocol']}): no run named {', '.join(missing)} "
                             "(bench_kvp.py --variants NAME@token=WEIGHTS,NAME@head=WEIGHTS)")  # fmt: skip
        for run in ctx["runs"]:
            loss, _, granularity = run["policy"].partition("@")
            if loss in losses and granularity in GRANULARITIES:
                rows.append({
                    "protocol": bench["protocol"], "context": ctx["name"], "context_tokens": ctx["context_tokens"],
                    "loss": loss, "granularity": granularity, "kept": round(1 - run["compression_ratio"], 6),
                    "mean_kl": statistics.fmean(run["kl"]), "top1": statistics.fmean(map(float, run["top1"])),
                    "retained": run["retained"],
                })  # fmt: skip
    return rows


def verdict(lo: float, hi: float) -> str:
    """``lower`` / ``higher`` when the interval of candidate - incumbent excludes zero, else ``no difference``."""
    return "lower" if hi < 0 else "higher" if lo > 0 else "no difference"


def paired_rows(rows: Sequence[dict], incumbent: str, candidate: str) -> list[dict[str, Any]]:
    """Candidate against incumbent per (protocol, granularity, kept share), paired over contexts."""
    cells: dict[tuple, dict[str, dict[str, dict]]] = {}
    for r in rows:
        cells.setdefault((r["protocol"], r["granularity"], r["kept"]), {}).setdefault(r["loss"], {})[r["context"]] = r
    out = []
    for (protocol, granularity, kept), by_loss in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        inc, cand = by_loss.get(incumbent, {}), by_loss.get(candidate, {})
        common = sorted(inc.keys() & cand.keys())
        if not common:
            raise ValueError(f"{protocol} {granularity} {kept:.0%}: no context where both losses ran")
        diffs = [cand[c]["mean_kl"] - inc[c]["mean_kl"] for c in common]
        _, lo, hi = mean_interval(diffs)
        out.append({
            "protocol": protocol, "granularity": granularity, "kept": f"{kept:.0%}", "kept_share": kept,
            "contexts": len(common),
            "incumbent_kl": statistics.fmean(inc[c]["mean_kl"] for c in common),
            "candidate_kl": statistics.fmean(cand[c]["mean_kl"] for c in common),
            "diff": ci_text(diffs, 4), "diff_lo": lo, "diff_hi": hi,
            "lower_n": sum(d < 0 for d in diffs), "lower": f"{sum(d < 0 for d in diffs)} / {len(common)}",
            "incumbent_top1": statistics.fmean(inc[c]["top1"] for c in common),
            "candidate_top1": statistics.fmean(cand[c]["top1"] for c in common),
            "verdict": verdict(lo, hi),
        })  # fmt: skip
    return out


def auc_row(loss: str, path: Path) -> dict[str, Any]:
    """A weights file's held-out AUC as kvp_train.py recorded it in the file's metadata."""
    from arbor_runtime.policies.kvp_weights import load_weights

    info = load_weights(path).info
    final = info.get("final") or {}
    if "kvp/head_auc" not in final:
        raise ValueError(f"{path}: no held-out AUC in its metadata (not written by scripts/kvp_train.py)")
    return {
        "loss": loss, "weights": str(path), "recorded_loss": info.get("loss"), "head_auc": final["kvp/head_auc"],
        "token_auc": final["kvp/token_auc"], "train_tokens": info["sequences"]["train_tokens"],
        "held_out": info["sequences"]["held_out"], "seconds": info.get("seconds"),
    }  # fmt: skip


def decide(aucs: dict[str, dict], paired: Sequence[dict], incumbent: str, candidate: str) -> dict[str, Any]:
    """The module docstring's rule, with the counts it rests on."""
    lower = [r for r in paired if r["verdict"] == "lower"]
    higher = [r for r in paired if r["verdict"] == "higher"]
    auc_ok = aucs[candidate]["head_auc"] >= aucs[incumbent]["head_auc"]
    ships = candidate if auc_ok and len(lower) > len(higher) else incumbent

    def where(rows: Sequence[dict]) -> str:
        return listed([f"{r['protocol']} {r['granularity']} {r['kept']}" for r in rows]) or "none"

    return {
        "incumbent": incumbent, "candidate": candidate, "ships": ships, "cells": len(paired),
        "lower": len(lower), "higher": len(higher), "no_difference": len(paired) - len(lower) - len(higher),
        "lower_where": where(lower), "higher_where": where(higher),
        "candidate_auc_at_least": auc_ok,
        "contexts": listed(sorted({r["contexts"] for r in paired})),
        "lower_point": sum(r["candidate_kl"] < r["incumbent_kl"] for r in paired),
    }  # fmt: skip


def build(benches: Sequence[dict], weights: dict[str, Path], incumbent: str, candidate: str) -> dict[str, Any]:
    """AUC rows, paired rows, facts and per-context rows from the bench outputs and the two weights files."""
    for name in (incumbent, candidate):
        if name not in weights:
            raise ValueError(f"--weights {name}=PATH is missing (the loss named by --incumbent / --candidate)")
    rows = [r for b in benches for r in context_rows(b, (incumbent, candidate))]
    paired = paired_rows(rows, incumbent, candidate)
    aucs = {name: auc_row(name, path) for name, path in weights.items()}
    facts = decide(aucs, paired, incumbent, candidate)
    facts |= {f"{name}_head_auc": a["head_auc"] for name, a in aucs.items()}
    facts |= {"contexts_named": listed([f"`{c}`" for c in dict.fromkeys(r["context"] for r in rows)])}
    facts |= {
        "steps": listed(sorted({b["steps"] for b in benches})),
        "held_out": listed(sorted({a["held_out"] for a in aucs.values()})),
    }
    return {"auc": list(aucs.values()), "paired": paired, "facts": facts, "rows": rows}


def _weights(items: Sequence[str]) -> dict[str, Path]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            raise ValueError(f"--weights {item!r} must be NAME=PATH of an existing weights file")
        out[name] = Path(path)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from arbor_cli.results import write_jsonl
    from benchmarks.results.data import columns_spec, write_section_data

    ap = argparse.ArgumentParser(prog="python -m benchmarks.kvp_loss", description=__doc__.split("\n")[0])
    ap.add_argument("benches", type=Path, nargs="+", help="scripts/bench_kvp.py outputs (one per protocol)")
    ap.add_argument("--weights", action="append", default=[], help="NAME=PATH of each loss's weights file")
    ap.add_argument("--incumbent", default="kvp", help="the weights shipped now (bench_kvp names them kvp)")
    ap.add_argument("--candidate", required=True, help="the weights that would replace them")
    ap.add_argument("--section", default=None, help="write docs/data/<section>/results.json (else print only)")
    ap.add_argument("--title", default="Which KVP weights ship: two losses paired on held-out contexts")
    ap.add_argument("--command", default="", help="the commands that made the inputs (recorded)")
    ap.add_argument("--setting", action="append", default=[], help="KEY=VALUE recorded in the section's settings")
    args = ap.parse_args(argv)
    try:
        benches = [json.loads(p.read_text()) for p in args.benches]
        out = build(benches, _weights(args.weights), args.incumbent, args.candidate)
    except (OSError, ValueError, KeyError) as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    for rows, spec in ((out["auc"], AUC_COLUMNS), (out["paired"], COLUMNS)):
        for r in rows:
            print(" | ".join(str(r[k]) if not isinstance(r[k], float) else f"{r[k]:.4f}" for k, _, _ in spec))
    print(f"ships: {out['facts']['ships']} (lower in {out['facts']['lower']}, higher in {out['facts']['higher']} "
          f"of {out['facts']['cells']} cells)")  # fmt: skip
    if args.section:
        settings = {"benches": [b.get("command", "") for b in benches]} | dict(s.split("=", 1) for s in args.setting)
        tables = {"auc": {"columns": columns_spec(AUC_COLUMNS), "rows": out["auc"]}}
        path = write_section_data(
            args.section, out["paired"], args.command, settings, title=args.title, columns=columns_spec(COLUMNS),
            tables=tables, facts=out["facts"],
        )  # fmt: skip
        write_jsonl(path.with_name("rows.jsonl"), out["rows"])  # every paired row recounts from these
        print(f"wrote {path} and rows.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
