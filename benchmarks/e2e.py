"""End to end, policy x budget (the ArborKV paper's Table 1 analog), read from ``arbor-solve``'s own run dirs.

The searches run through the console script a user runs (``scripts/bench_e2e.sh``): once under
``policy=full`` with no budget (the reference: each problem's peak device KV, its answer, its tree),
then a Hydra sweep of policies x ``policy.budget_ratio`` against that reference (each problem's
budget is the ratio x full's peak on that problem, set from the start). This module reads the run
dirs back (``results.jsonl`` and ``trees/<index>.json``) and writes one row per policy and budget:

- solved: problems solved (with its 95% Wilson interval);
- agrees with full: the same final answer as full's on the same problem (no answer = no answer, but a
  search that ran out of memory never agrees);
- nodes as full: the share of full's tree nodes the run rebuilt with the same text along the same
  path (mean over problems; 1.00 = full's whole tree);
- solved where full did not / not solved where full did (``gained_n`` / ``lost_n``), shown with the
  two-sided exact sign test's p-value on those pairs (``vs_full``; empty on the reference's own row);
- peak device KV (mean MB over problems) and the KV pool the runtime allocated (``pool_mb``: with a
  budget, that budget's pool; without one, the pool as it grew), seconds (p50 / p95 over problems),
  problems solved per hour of search (solved over the summed seconds), rehydrations (mean), out of
  memory (problems whose search ended in a KV budget error, with its interval).

The section's commit is the code its rows were searched with (each row's ``code``), not the checkout
that writes the section: the run dirs of a benchmark resumed over several sittings may hold rows of
several commits, and the section then names each with its count (:func:`row_codes`).

    python -m benchmarks.e2e SEARCH FULL_RUN_DIR SWEEP_DIR [--section e2e-game24] --command "..."
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from arbor_cli.results import load_done, write_jsonl
from arbor_cli.sweep import find_jobs
from benchmarks.results.stats import format_rate, sign_test

#: the section's main table: (key, header, fmt)
COLUMNS = (
    ("search", "search", "text"), ("policy", "policy", "text"), ("setting", "setting", "text"),
    ("budget", "budget", "text"),
    ("problems", "n", "auto"), ("solved", "solved [95% CI]", "text"),
    ("vs_full", "gained / lost vs full (sign test p)", "text"), ("agree", "same answer as full [95% CI]", "text"),
    ("nodes_as_full", "nodes as full", "{:.2f}"), ("peak_kv_mb", "peak KV MB", "{:.1f}"),
    ("x_full_kv", "x full's peak KV", "{:.2f}"), ("pool_mb", "KV pool MB", "{:.1f}"), ("p50_s", "p50 s", "{:.1f}"),
    ("p95_s", "p95 s", "{:.1f}"), ("solved_per_h", "solved / hour", "{:.1f}"),
    ("rehydrations", "rehydrations", "{:.1f}"), ("oom", "OOM [95% CI]", "text"),
)  # fmt: skip


# ---- reading run dirs ---------------------------------------------------------------------------
def tree_paths(run_dir: Path, index: int) -> set[tuple[str, ...]]:
    """Every node of the problem's saved tree as the texts along its path from the root (empty: no tree)."""
    path = run_dir / "trees" / f"{index}.json"
    if not path.is_file():
        return set()
    nodes = {n["id"]: n for n in json.loads(path.read_text())["nodes"]}

    def texts(node_id: int) -> tuple[str, ...]:
        out = []
        while node_id is not None and node_id in nodes:
            out.append(nodes[node_id]["text"])
            node_id = nodes[node_id]["parent"]
        return tuple(reversed(out))

    return {texts(i) for i in nodes}


#: swept overrides a row names besides policy and budget (the search's shape)
SETTING_KEYS = (
    "controller.breadth", "controller.n_generate", "controller.max_expansions", "verifier.lookahead",
    "verifier.trial_values",
)  # fmt: skip


def varying_settings(jobs) -> set[str]:
    """The search-shape overrides (:data:`SETTING_KEYS`) that differ between ``jobs``."""
    return {k for k in SETTING_KEYS if len({j.overrides.get(k) for j in jobs}) > 1}


def sweep_runs(sweep_dir: Path, varying: set[str] | None = None) -> list[tuple[str, float | None, str, Path]]:
    """(policy, budget ratio, the search-shape overrides that differ between the jobs as text, run dir) of
    every job of a Hydra sweep (:func:`arbor_cli.sweep.find_jobs`: its ``.hydra/overrides.yaml``); an
    override every job has alike (the search both runs share) names no setting; the keys are named in
    :data:`SETTING_KEYS`' order, whatever order the command gave them in. ``varying``: the keys
    that differ, when the jobs of several sweeps are compared (default: those of this sweep's jobs)."""
    jobs = find_jobs(sweep_dir)
    varying = varying_settings(jobs) if varying is None else varying
    out = []
    for job in jobs:
        found = dict(job.overrides)
        ratio = found.pop("policy.budget_ratio", None)
        policy = found.pop("policy", job.choices.get("policy", "full"))
        other = " ".join(f"{k}={found[k]}" for k in SETTING_KEYS if k in varying and k in found)
        out.append((policy, None if ratio is None else float(ratio), other, job.path))
    return out


# ---- one row per policy and budget ----------------------------------------------------------------
def _pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


#: the section's per-problem rows, beside its results.json
ROWS_FILE = "rows.jsonl"
#: what a section's ``rows.jsonl`` holds of each problem of each table row (the totals recount from these)
ROW_FIELDS = (
    "index", "answer", "solved", "agree", "nodes_as_full", "seconds", "peak_device_tokens", "peak_device_bytes",
    "pool_bytes", "oom", "budget_tokens", "floor_tokens", "rehydrations", "code", "weights",
)  # fmt: skip


def problem_rows(run_dir: Path, ref: Path, ref_rows: dict[int, dict]) -> list[dict[str, Any]]:
    """One record per problem ``run_dir`` shares with the reference run ``ref``: its answer and whether it
    solved it, agrees with full's answer (an out-of-memory search answers nothing: it never agrees, even where
    full gave no answer either) and rebuilt full's tree (the share of its nodes with the same text along the
    same path), its seconds, peaks, pool, OOM, budget and floor (:data:`ROW_FIELDS`)."""
    rows = load_done(run_dir)
    shared = sorted(rows.keys() & ref_rows.keys())
    if not shared:
        raise ValueError(f"{run_dir}: no problem in common with the reference {ref}")
    out = []
    for i in shared:
        row, theirs, ours = rows[i], tree_paths(ref, i), tree_paths(run_dir, i)
        out.append(
            {k: row.get(k) for k in ROW_FIELDS}
            | {
                "solved": bool(row.get("solved")), "oom": bool(row.get("oom")),
                "agree": not row.get("oom") and row.get("answer") == ref_rows[i].get("answer"),
                "nodes_as_full": len(theirs & ours) / len(theirs) if theirs else 0.0,
                "seconds": float(row.get("seconds") or 0.0), "rehydrations": int(row.get("rehydrations") or 0),
                "full_solved": bool(ref_rows[i].get("solved")),
                "full_peak_device_bytes": float(ref_rows[i].get("peak_device_bytes") or 0.0),
            }
        )  # fmt: skip
    return out


def summarise(
    search: str, label: str, ratio: float | None, run_dir: Path, ref: Path, ref_rows: dict[int, dict], setting: str = ""
) -> dict[str, Any]:
    """One table row: ``run_dir``'s problems against the reference run ``ref`` (full, no budget), totalled
    from :func:`problem_rows` (kept under ``"problem_rows"`` for the section's ``rows.jsonl``)."""
    per = problem_rows(run_dir, ref, ref_rows)
    n = len(per)
    solved = sum(r["solved"] for r in per)
    # paired with the reference, problem by problem: what a solve rate alone cannot separate at this n
    gained = sum(r["solved"] and not r["full_solved"] for r in per)
    lost = sum(not r["solved"] and r["full_solved"] for r in per)
    agree, oom = sum(r["agree"] for r in per), sum(r["oom"] for r in per)
    seconds = [r["seconds"] for r in per]
    peak = [float(r["peak_device_bytes"] or 0.0) for r in per]
    ref_peak = [r["full_peak_device_bytes"] for r in per]
    pool = [float(r["pool_bytes"] or 0.0) for r in per]
    p = None if run_dir == ref else sign_test(gained, lost)  # the reference is not tested against itself
    return {
        "search": search, "policy": label, "setting": setting,
        "budget": "none" if ratio is None else f"{ratio:g}x full peak",
        "ratio": ratio, "problems": n, "solved": format_rate(solved, n), "solved_n": solved,
        "gained_n": gained, "lost_n": lost, "sign_p": p,
        "vs_full": "" if p is None else f"+{gained} / -{lost} (p {p:.2g})",
        "agree": format_rate(agree, n), "agree_n": agree,
        "nodes_as_full": statistics.mean(r["nodes_as_full"] for r in per), "peak_kv_mb": statistics.mean(peak) / 2**20,
        "x_full_kv": sum(peak) / sum(ref_peak) if sum(ref_peak) else None,
        "pool_mb": statistics.mean(pool) / 2**20,
        "mean_s": statistics.mean(seconds), "p50_s": _pct(seconds, 0.5), "p95_s": _pct(seconds, 0.95),
        "solved_per_h": solved / (sum(seconds) / 3600) if sum(seconds) else None,
        "rehydrations": statistics.mean(r["rehydrations"] for r in per),
        "oom": format_rate(oom, n), "oom_n": oom, "problem_rows": per,
    }  # fmt: skip


def section_rows(table_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every table row's problems as the lines of the section's ``rows.jsonl`` (each names its table row by
    policy, budget and setting), taking them out of the table rows."""
    out = []
    for row in table_rows:
        key = {"policy": row["policy"], "budget": row["budget"], "setting": row["setting"]}
        out += [key | problem for problem in row.pop("problem_rows")]
    return out


def table(search: str, full_dir: Path, sweep_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """The reference's row, then every sweep job's (policies and settings as first swept, budgets from
    large to small)."""
    ref_rows = load_done(full_dir)
    out = [summarise(search, "full", None, full_dir, full_dir, ref_rows)]
    sweep_dirs = list(sweep_dirs)
    # over the reference and every sweep: one naming, and a key every sweep sets alike but the reference does
    # not (verifier.lookahead=1 in two runs that differ by their trial values) still names the rows
    varying = varying_settings([j for d in [full_dir, *sweep_dirs] for j in find_jobs(d)])
    runs = [r for d in sweep_dirs for r in sweep_runs(d, varying)]
    order = list(dict.fromkeys(p for p, _, _, _ in runs))
    shapes = list(dict.fromkeys(o for _, _, o, _ in runs))
    for policy, ratio, other, run_dir in sorted(
        runs, key=lambda r: (order.index(r[0]), shapes.index(r[2]), -(r[1] or 0.0))
    ):
        out.append(summarise(search, policy, ratio, run_dir, full_dir, ref_rows, other))
    return out


#: how a row written before rows recorded their code is counted
UNRECORDED = "not recorded"


def row_codes(run_dirs: Iterable[Path]) -> dict[str, int]:
    """How many results rows of ``run_dirs`` each code searched (the row's ``code``, see
    :func:`arbor_cli.provenance.code_version`; :data:`UNRECORDED` for older rows), most rows first."""
    counts = Counter(str(row.get("code") or UNRECORDED) for d in run_dirs for row in load_done(d).values())
    return dict(counts.most_common())


def weights_used(run_dirs: Iterable[Path]) -> str:
    """The model weight formats the results rows of ``run_dirs`` ran with (``model.weights`` as resolved,
    e.g. ``int4``), joined; ``not recorded`` for rows older than the switch (float32 then)."""
    found = {str(row.get("weights") or UNRECORDED) for d in run_dirs for row in load_done(d).values()}
    return ", ".join(sorted(found))


def measured_by(codes: dict[str, int]) -> dict[str, Any]:
    """The section's commit fields from :func:`row_codes`: ``commit`` the code of most rows (None when
    no row names one); ``row_codes`` (each code's rows) too unless every row names that one code."""
    recorded = [c for c in codes if c != UNRECORDED]
    commit = {"commit": recorded[0] if recorded else None}
    return commit if len(codes) == 1 and recorded else commit | {"row_codes": codes}


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.results.data import columns_spec, write_section_data

    ap = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__.split("\n")[0])
    ap.add_argument("search", help="the search's name in the table (e.g. game24-bfs5)")
    ap.add_argument("full", type=Path, help="the reference run dir (policy=full, no budget)")
    ap.add_argument("sweeps", type=Path, nargs="+", help="Hydra sweep dirs of policies x policy.budget_ratio")
    ap.add_argument("--section", default=None, help="write docs/data/<section>/results.json (else print only)")
    ap.add_argument("--title", default=None, help="the section's title")
    ap.add_argument("--command", default="", help="the commands that made the run dirs (recorded)")
    ap.add_argument("--setting", action="append", default=[], help="KEY=VALUE recorded in the section's settings")
    args = ap.parse_args(argv)
    rows = table(args.search, args.full, args.sweeps)
    per_problem = section_rows(rows)
    for r in rows:
        print(" | ".join(str(r[k]) if not isinstance(r[k], float) else f"{r[k]:.2f}" for k, _, _ in COLUMNS))
    if args.section:
        columns = columns_spec(COLUMNS)
        dirs = [args.full] + [run_dir for d in args.sweeps for *_, run_dir in sweep_runs(d)]
        settings = {"weights": weights_used(dirs)} | dict(s.split("=", 1) for s in args.setting)
        extra = measured_by(row_codes(dirs)) | {"title": args.title, "columns": columns}
        path = write_section_data(args.section, rows, args.command, settings, **extra)
        write_jsonl(path.with_name(ROWS_FILE), per_problem)  # every total above recounts from these
        print(f"wrote {path} and {ROWS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
