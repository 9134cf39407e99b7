"""Per-head retention against whole tokens (issue 66): the results section from the KVP benchmark's two
protocols run at both granularities, and the decode time per step at both.

    P=kvp,kvp@head,random,random@head,streaming,streaming@head,h2o,h2o@head,snapkv,snapkv@head
    python scripts/bench_kvp.py --protocol compress --threads 1 --shares 0.1,0.25,0.5,0.75,0.9 --policies $P \\
        --out bench/results-full/kvp-head/bench-compress.json
    python scripts/bench_kvp.py --protocol budget (the same) --out bench/results-full/kvp-head/bench-budget.json
    python -m benchmarks.per_head_step --data-dir ../shared/data --out bench/results-full/kvp-head/step.json
    python -m benchmarks.per_head bench/results-full/kvp-head/bench-compress.json \\
        bench/results-full/kvp-head/bench-budget.json --step bench/results-full/kvp-head/step.json \\
        --kvpress docs/data/linear/results.json --section

kvpress's runs at shares the linear section lacks, added to the committed section without rerunning the
KVP benchmark (its per-context rows and step timings are kept, and the page says when they were measured):

    python scripts/bench_linear.py --policies streaming,h2o,snapkv --presses streaming,observed_attention,snapkv \
        --shares 0.9,0.75 --threads 1 --out bench/results-full/kvp-head/linear-7590.json
    python -m benchmarks.per_head --keep --kvpress docs/data/linear/results.json \
        --kvpress bench/results-full/kvp-head/linear-7590.json --section

Per protocol, kept share and policy: the mean KL(full || compressed) and top-1 agreement over every
teacher-forced continuation step of every context, and the retained future attention (per layer and KV
head: what each head keeps of its own future attention), at ``granularity=token`` and ``=head``; per
context, the same (the rows every mean is recounted from).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.results.data import columns_spec, load_section, write_section_data
from benchmarks.results.tables import render_table

SECTION = "per-head"
TITLE = "Per-head retention: each layer and KV head keeps its own tokens"
TREE_BLIND = ("random", "streaming", "h2o", "snapkv", "kvp")
GRANULARITIES = ("token", "head")


#: a KL column's format
KL = "{:.4f}"
MAIN_COLUMNS = columns_spec([
    ("protocol", "protocol", "text"),
    ("kept", "kept", "{:.0%}"),
    ("policy", "policy", "text"),
    ("kl_token", "KL token", KL),
    ("kl_head", "KL head", KL),
    ("kl_ratio", "head / token", "{:.2f}"),
    ("top1_token", "top-1 token", "{:.3f}"),
    ("top1_head", "top-1 head", "{:.3f}"),
    ("retained_token", "retained token", "{:.3f}"),
    ("retained_head", "retained head", "{:.3f}"),
    ("contexts_head_lower", "contexts head lower", "auto"),
])  # fmt: skip
CONTEXT_COLUMNS = columns_spec([
    ("protocol", "protocol", "text"),
    ("context", "context", "text"),
    ("kept", "kept", "{:.0%}"),
    ("policy", "policy", "text"),
    ("granularity", "granularity", "text"),
    ("kl", "mean KL", KL),
    ("top1", "top-1", "{:.3f}"),
    ("retained", "retained", "{:.3f}"),
    ("steps", "steps", "auto"),
])  # fmt: skip
BEST_COLUMNS = columns_spec([
    ("protocol", "protocol", "text"),
    ("kept", "kept", "{:.0%}"),
    ("best", "lowest KL (either granularity)", "text"),
    ("best_kl", "its KL", KL),
    ("kvp_head_kl", "kvp per head", KL),
    ("kvp_head_rank", "kvp per head's rank of 10", "auto"),
])  # fmt: skip
KVPRESS_COLUMNS = columns_spec([
    ("policy", "policy", "text"),
    ("press", "kvpress press", "text"),
    ("kept", "kept", "{:.0%}"),
    ("kl_head", "KL per head (here)", KL),
    ("press_kl", "KL press as shipped (per head)", KL),
    ("head_vs_press", "here / press", "{:.3f}"),
    ("kl_token", "KL whole tokens (here)", KL),
    ("press_token_kl", "KL press, whole tokens", KL),
    ("token_vs_press", "here / press", "{:.3f}"),
])  # fmt: skip
STEP_COLUMNS = columns_spec([
    ("policy", "policy", "text"),
    ("token_ms", "token ms a step", "{:.1f}"),
    ("head_ms", "head ms a step", "{:.1f}"),
    ("ratio", "head / token (median)", "{:.3f}"),
    ("ratio_min", "min", "{:.3f}"),
    ("ratio_max", "max", "{:.3f}"),
])  # fmt: skip


def context_rows(bench: dict) -> list[dict]:
    """One row per (context, policy, granularity, kept share): its mean KL and top-1 over the steps."""
    rows = []
    for ctx in bench["per_context"]:
        for run in ctx["runs"]:
            if "kl" not in run:  # the oracle rows carry retained attention only
                continue
            name, _, granularity = run["policy"].partition("@")
            rows.append(
                {
                    "protocol": bench["protocol"],
                    "context": ctx["name"],
                    "kept": round(1 - run["compression_ratio"], 6),
                    "policy": name,
                    "granularity": granularity or "token",
                    "kl": sum(run["kl"]) / len(run["kl"]),
                    "top1": sum(map(float, run["top1"])) / len(run["top1"]),
                    "retained": run["retained"],
                    "steps": len(run["kl"]),
                    "kl_steps": run["kl"],
                }
            )
    return rows


def main_rows(contexts: list[dict]) -> list[dict]:
    """Per (protocol, kept share, policy): both granularities' step-weighted means over the contexts."""
    cells: dict[tuple, dict[str, list[dict]]] = {}
    for r in contexts:
        cells.setdefault((r["protocol"], r["kept"], r["policy"]), {}).setdefault(r["granularity"], []).append(r)
    rows = []
    for (protocol, kept, policy), by in sorted(cells.items()):
        if set(by) != set(GRANULARITIES):
            continue
        row: dict[str, Any] = {"protocol": protocol, "kept": kept, "policy": policy}
        for g in GRANULARITIES:
            runs = by[g]
            steps = sum(r["steps"] for r in runs)
            row[f"kl_{g}"] = sum(r["kl"] * r["steps"] for r in runs) / steps
            row[f"top1_{g}"] = sum(r["top1"] * r["steps"] for r in runs) / steps
            row[f"retained_{g}"] = sum(r["retained"] for r in runs) / len(runs)
        row["kl_ratio"] = row["kl_head"] / row["kl_token"] if row["kl_token"] > 0 else float("nan")
        pairs = {r["context"]: r["kl"] for r in by["head"]}
        lower = sum(1 for r in by["token"] if pairs.get(r["context"], float("inf")) < r["kl"])
        row["contexts_head_lower"] = f"{lower}/{len(by['token'])}"
        rows.append(row)
    return rows


def best_rows(main: list[dict]) -> list[dict]:
    """Per (protocol, kept share): the tree-blind variant with the lowest KL (a policy whose two
    granularities tie, as streaming's always do, named without one), and kvp per head's rank (1 + the
    variants with a strictly lower KL)."""
    out = []
    for protocol, kept in sorted({(r["protocol"], r["kept"]) for r in main}):
        mine = [r for r in main if (r["protocol"], r["kept"]) == (protocol, kept) and r["policy"] in TREE_BLIND]
        if not mine:
            continue
        top = min(mine, key=lambda r: min(r["kl_token"], r["kl_head"]))
        best_kl = min(top["kl_token"], top["kl_head"])
        if top["kl_token"] == top["kl_head"]:
            best = top["policy"]
        else:
            best = f"{top['policy']}@{'head' if top['kl_head'] < top['kl_token'] else 'token'}"
        kvp = next((r["kl_head"] for r in mine if r["policy"] == "kvp"), None)
        lower = sum(1 for r in mine for g in GRANULARITIES if kvp is not None and r[f"kl_{g}"] < kvp)
        out.append(
            {
                "protocol": protocol,
                "kept": kept,
                "best": best,
                "best_kl": best_kl,
                "kvp_head_kl": kvp,
                "kvp_head_rank": lower + 1 if kvp is not None else None,
            }
        )
    return out


def facts_of(main: list[dict], best: list[dict], step: dict | None) -> dict[str, Any]:
    """The sentences' figures, per protocol P: ``P_POLICY_head_lower`` of ``P_cells`` kept shares where per
    head has the lower KL, ``P_POLICY_head_worse`` the shares where it has the higher (text), and
    ``P_kvp_head_best`` the shares where kvp per head is the lowest of all ten variants; the largest
    decode-time ratio head / token."""
    facts: dict[str, Any] = {}
    for protocol in sorted({r["protocol"] for r in main}):
        mine = [r for r in main if r["protocol"] == protocol]
        facts[f"{protocol}_cells"] = len({r["kept"] for r in mine})
        for policy in sorted({r["policy"] for r in mine}):
            rows = [r for r in mine if r["policy"] == policy]
            facts[f"{protocol}_{policy}_head_lower"] = sum(1 for r in rows if r["kl_head"] < r["kl_token"])
            worse = [f"{r['kept']:.0%}" for r in rows if r["kl_head"] > r["kl_token"]]
            facts[f"{protocol}_{policy}_head_worse"] = ", ".join(worse) or "none"
        ranks = [r for r in best if r["protocol"] == protocol]
        facts[f"{protocol}_kvp_head_best"] = sum(1 for r in ranks if r["best"] == "kvp@head")
        facts[f"{protocol}_kvp_head_worst_rank"] = max((r["kvp_head_rank"] or 0 for r in ranks), default=0)
    if step is not None:
        facts["step_ratio_max"] = max(r["ratio"] for r in step["rows"])
        facts["step_policy_max"] = max(step["rows"], key=lambda r: r["ratio"])["policy"]
    return facts


def press_runs(doc: dict) -> list[dict]:
    """kvpress's own runs of one file as rows (policy, kvpress_press, kept in %, press_kl, token_kl): the
    linear section's data (docs/data/linear/results.json) or a ``scripts/bench_linear.py`` output (its
    ``comparison``, e.g. at shares the section does not cover)."""
    if "comparison" in doc:
        return [
            {"policy": r["policy"], "kvpress_press": r["press"], "kept": round(100 * r["kept_share"], 6)}
            | {"press_kl": r["press_kl"], "token_kl": r["token_kl"]}
            for r in doc["comparison"]
        ]
    return doc["tables"]["main"]["rows"]


def kvpress_rows(main: list[dict], linear: list[dict]) -> list[dict]:
    """Compressing once, each policy at both granularities beside its kvpress counterpart as shipped (per
    head) and with its scores averaged over heads (whole tokens), from kvpress's own runs on the same
    contexts and protocol (:func:`press_runs` of each file; a share in several files: the first)."""
    out, seen = [], set()
    for r in linear:
        mine = [m for m in main if m["protocol"] == "compress" and m["policy"] == r["policy"]]
        mine = [m for m in mine if abs(m["kept"] * 100 - r["kept"]) < 1e-6]
        if not mine or (r["policy"], r["kept"]) in seen:
            continue
        seen.add((r["policy"], r["kept"]))
        m = mine[0]
        out.append(
            {
                "policy": m["policy"],
                "press": r["kvpress_press"],
                "kept": m["kept"],
                "kl_head": m["kl_head"],
                "press_kl": r["press_kl"],
                "head_vs_press": m["kl_head"] / r["press_kl"],
                "kl_token": m["kl_token"],
                "press_token_kl": r["token_kl"],
                "token_vs_press": m["kl_token"] / r["token_kl"],
            }
        )
    order = list(dict.fromkeys(r["policy"] for r in linear))  # the policies as kvpress's runs list them
    return sorted(out, key=lambda r: (order.index(r["policy"]), -r["kept"]))


def build(contexts: list[dict], step: dict | None, linear: list[dict] | None = None) -> dict[str, Any]:
    """The section's tables and facts from the per-context rows (:func:`context_rows` of the benches, or
    a committed section's ``contexts`` table), the step timings and kvpress's runs."""
    main = main_rows(contexts)
    best = best_rows(main)
    tables = {
        "best": {"columns": BEST_COLUMNS, "rows": best},
        "contexts": {"columns": CONTEXT_COLUMNS, "rows": contexts},
    }
    if linear is not None:
        tables["kvpress"] = {"columns": KVPRESS_COLUMNS, "rows": kvpress_rows(main, linear)}
    if step is not None:
        tables["step"] = {"columns": STEP_COLUMNS, "rows": step["rows"]}  # with each repetition's ms
    facts = facts_of(main, best, step)
    if linear is not None:
        snap = [r for r in tables["kvpress"]["rows"] if r["policy"] == "snapkv"]
        facts["snapkv_press_max_rel_diff"] = max((abs(r["head_vs_press"] - 1) for r in snap), default=None)
        facts["snapkv_press_shares"] = ", ".join(f"{r['kept']:.0%}" for r in snap)
        h2o = [r for r in tables["kvpress"]["rows"] if r["policy"] == "h2o"]
        facts["h2o_head_below_press"] = sum(1 for r in h2o if r["head_vs_press"] < 1)
        facts["h2o_press_shares"] = len(h2o)
    return {"main": main, "tables": tables, "facts": facts}


#: the facts made from the step timings and from kvpress's runs (what ``--keep`` redoes)
STEP_FACTS = ("step_ratio_max", "step_policy_max")
KVPRESS_FACTS = ("snapkv_press_max_rel_diff", "snapkv_press_shares", "h2o_head_below_press", "h2o_press_shares")


def kept_measurement(old: dict, facts: dict, new_step: bool) -> dict:
    """What a ``--keep`` run carries from the committed measurement: every table but kvpress's (and the
    step timings', ``new_step``: measured again), and every fact not about them (the page says when and
    at which commit the kept ones were measured)."""
    carried = old.get("carried") or {"measured": old["measured"], "commit": old["commit"]}
    redone = ("kvpress", "step") if new_step else ("kvpress",)
    fresh = KVPRESS_FACTS + (STEP_FACTS if new_step else ())
    return carried | {
        "tables": [t for t in old["tables"] if t not in redone],
        "facts": [k for k in facts if k not in fresh],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benches", type=Path, nargs="*", help="bench_kvp.py outputs (--policies with NAME@head)")
    ap.add_argument("--step", type=Path, default=None, help="benchmarks.per_head_step output")
    ap.add_argument(
        "--kvpress", type=Path, action="append", default=[],
        help="kvpress's own runs: docs/data/linear/results.json or a bench_linear.py output (repeatable)",
    )  # fmt: skip
    ap.add_argument(
        "--keep", action="store_true",
        help="no benches: keep the committed section's per-context rows and step timings, redo its kvpress table",
    )  # fmt: skip
    ap.add_argument("--section", action="store_true", help=f"write docs/data/{SECTION}/results.json")
    args = ap.parse_args(argv)
    if args.keep == bool(args.benches):
        ap.error("give bench_kvp.py outputs, or --keep to reuse the committed section's rows (not both)")
    for path in [*args.benches, *([args.step] if args.step else []), *args.kvpress]:
        if not path.is_file():
            ap.error(f"{path}: no such file")
    old = load_section(SECTION) if args.keep else None
    benches = [json.loads(p.read_text()) for p in args.benches]
    contexts = old["tables"]["contexts"]["rows"] if old else [r for b in benches for r in context_rows(b)]
    step = json.loads(args.step.read_text()) if args.step else None
    if old and step is None and "step" in old["tables"]:
        step = {"rows": old["tables"]["step"]["rows"]}
    docs = [json.loads(p.read_text()) for p in args.kvpress]
    linear = [r for d in docs for r in press_runs(d)] if docs else None
    built = build(contexts, step, linear)
    console = Console()
    print(render_table({"columns": MAIN_COLUMNS, "rows": built["main"]}))
    print(render_table(built["tables"]["best"]))
    if args.section:
        this = "python -m benchmarks.per_head " + " ".join(sys.argv[1:] if argv is None else argv)
        if old:  # the bench (and step) commands as recorded, then what ran again and this one
            redone = ("python -m benchmarks.per_head ",) + (
                ("python -m benchmarks.per_head_step",) if args.step else ()
            )
            kept = [c for c in old["command"].splitlines() if not c.startswith(redone)]
            again = [d["command"] for d in docs if "comparison" in d] + ([step["command"]] if args.step else [])
            commands = list(dict.fromkeys(kept + again))
            settings, carried = old["settings"], kept_measurement(old, built["facts"], bool(args.step))
        else:
            commands = [b["command"] for b in benches] + ([step["command"]] if step else [])
            settings = {"contexts": [c["name"] for c in benches[0]["contexts"]], "steps": benches[0]["steps"]}
            carried = None
        path = write_section_data(
            SECTION,
            built["main"],
            "\n".join([*commands, this]),
            settings,
            title=TITLE,
            columns=MAIN_COLUMNS,
            tables=built["tables"],
            facts=built["facts"],
            carried=carried,
        )
        console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
