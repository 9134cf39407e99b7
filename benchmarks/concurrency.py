"""Problems per hour at several concurrency levels, and against naive ToT, on the same problems.

Each setting runs ``arbor-solve``'s own loop (:func:`arbor_cli.run.solve_all`) on the configured
problems in a fresh run dir: ``concurrency=1`` solves them one after another, ``concurrency=N``
runs N searches at once in one runtime (their rows batched together, one budget). ``naive`` runs
the same controller over :class:`~benchmarks.naive.NaiveRuntime` (every node's prompt re-sent
to ``generate``, as the reference ToT code does). Every setting reports wall time, problems/hour,
the peak device KV and whether each problem's result equals the ``concurrency=1`` one.

Interrupted, the same command resumes: each setting's row is appended to ``concurrency.partial.jsonl``
as soon as it is measured (with a digest of its per-problem results, for the comparison with
``concurrency=1``), beside the arguments it was started with; a rerun with the same arguments keeps
those rows and measures the rest (after the same untimed warm-up), other arguments start over.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from arbor_cli.build import USER_ERRORS, build, compose_config
from arbor_cli.results import write_csv, write_jsonl
from arbor_cli.run import solve_all
from benchmarks.naive import NaiveRuntime

#: result fields that must not depend on concurrency: the search's outcome and the tokens it sampled.
#: Not prefill_tokens / nodes_created: a verifier's few-shot prefix (llm_value) is one tree per
#: runtime, prefilled once per problem at concurrency 1 (a fresh runtime each) but once for all
#: problems in a shared runtime (charged to the search that asks first).
SAME = ("solved", "answer", "best_path", "nodes_expanded", "decode_tokens", "oom")


def run_setting(overrides: Sequence[str], loaded=None) -> tuple[list[dict[str, Any]], float, Any]:
    """One ``solve_all`` in a temporary run dir; returns (rows, wall seconds, the model)."""
    setup = build(compose_config([*overrides, "save_trees=false", "resume=false"]), loaded)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        rows = solve_all(setup, Path(tmp), Console(quiet=True))
        return rows, time.perf_counter() - start, setup.loaded


def run_naive(overrides: Sequence[str], loaded) -> tuple[list[dict[str, Any]], float]:
    """The configured controller over :class:`NaiveRuntime`, one problem after another."""
    setup = build(compose_config(list(overrides)), loaded)
    rows, start = [], time.perf_counter()
    for problem in setup.problems:
        rt = NaiveRuntime(setup.loaded)
        result = setup.controller(rt).solve(problem, seed=setup.seed(problem))
        rows.append({"index": problem.index, "solved": result.solved, "decode_tokens": rt.metrics.decode_tokens})
    return rows, time.perf_counter() - start


def concurrency_rows(
    overrides: Sequence[str],
    levels: Sequence[int],
    policies: Sequence[str],
    naive: bool,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
    done: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Every policy at every concurrency level (plus naive); one summary dict per setting, each
    also handed to ``on_row`` as soon as it is measured (so a failure later loses nothing). ``done``:
    rows measured by an earlier attempt (a resumed run), kept as they are."""
    measured = {(r["policy"], r["concurrency"]): r for r in done}
    out, reference = [], {}
    if len(measured) < len(policies) * len(levels) + naive:
        warm = [o for o in overrides if not o.startswith(("task.start=", "task.end="))]
        start = next((o.split("=")[1] for o in overrides if o.startswith("task.start=")), None)
        if start is not None:  # one untimed problem first: model load, first-call costs
            warm += [f"task.start={start}", f"task.end={int(start) + 1}"]
        _, _, loaded = run_setting(warm)
    for policy in policies:
        over = [*overrides, *policy.split()]
        for level in levels:
            row = measured.get((policy, level))
            if row is None:
                rows, seconds, loaded = run_setting([*over, f"concurrency={level}"], loaded)
                row = _summary(policy, level, rows, seconds, same=None)
            reference.setdefault(policy, row["results_digest"])
            row["same_results_as_concurrency_1"] = row["results_digest"] == reference[policy]
            out.append(row)
            if (policy, level) not in measured:
                on_row(row)
    if naive:
        row = measured.get(("naive ToT", 1))
        if row is None:
            rows, seconds = run_naive(overrides, loaded)
            row = _summary("naive ToT", 1, rows, seconds, same=None)
            on_row(row)
        out.append(row)
    return out


def results_digest(rows: list[dict[str, Any]]) -> str:
    """12 hex digits of every problem's outcome (:data:`SAME`): equal digests, equal results."""
    key = sorted((str(r["index"]), [r.get(k) for k in SAME]) for r in rows)
    return hashlib.sha1(json.dumps(key, default=str).encode()).hexdigest()[:12]


def _summary(policy: str, level: int, rows: list[dict[str, Any]], seconds: float, same: bool | None) -> dict:
    peaks = [r.get("peak_device_tokens") or 0 for r in rows]
    return {
        "policy": policy,
        "concurrency": level,
        "problems": len(rows),
        "seconds": round(seconds, 1),
        "problems_per_hour": round(3600 * len(rows) / seconds, 1),
        "solved": sum(bool(r.get("solved")) for r in rows),
        "oom": sum(bool(r.get("oom")) for r in rows),
        "peak_device_tokens": max(peaks) if peaks else 0,
        # the summed per-problem peaks (what budgets are fractions of): meaningful at concurrency 1 only;
        # at N > 1 each problem reports its shared runtime's peak
        "peak_device_tokens_sum": sum(peaks),
        "peak_device_mb": round(max((r.get("peak_device_bytes") or 0) for r in rows) / 2**20, 1),
        "decode_tokens": sum(r.get("decode_tokens") or 0 for r in rows),
        "same_results_as_concurrency_1": same,
        "results_digest": results_digest(rows),
        **{k: round(sum(r.get(k) or 0 for r in rows), 2) for k in BREAKDOWN},
    }


#: per-problem metrics summed over a setting's problems: where its time went (issue 23)
BREAKDOWN = (
    "rehydrations", "evicted_tokens", "recomputed_tokens", "preemptions", "preempted_tokens", "turn_wait_seconds",
    "wait_seconds", "restore_seconds", "evict_seconds", "plan_seconds", "recompute_seconds", "model_seconds",
    "prefix_prefill_saved_tokens", "prefix_resident_saved_tokens",
)  # fmt: skip


def concurrency_main(argv: Sequence[str] | None = None) -> int:
    """``bench_concurrency.py``: the table, plus JSONL and CSV under ``--out``."""
    ap = argparse.ArgumentParser(prog="bench_concurrency.py", description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1,2,4,8", help="concurrency levels")
    ap.add_argument(
        "--policies",
        default="policy=full",
        help="';'-separated override sets, e.g. 'policy=full;policy=arbor policy.budget_tokens=1500'",
    )
    ap.add_argument("--naive", action="store_true", help="also run naive ToT (generate per node)")
    ap.add_argument("--out", default="bench/concurrency", help="folder for concurrency.jsonl / .csv")
    ap.add_argument("overrides", nargs="*", help="arbor-solve overrides (task=, controller=, model=...)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    partial = out / "concurrency.partial.jsonl"
    try:
        levels = [int(x) for x in args.levels.split(",")]
        if not levels or min(levels) < 1:
            raise ValueError(f"--levels {args.levels!r}: positive integers, e.g. 1,2,4,8")
        out.mkdir(parents=True, exist_ok=True)
        policies = [p.strip() for p in args.policies.split(";")]
        done = _resume(out, {"levels": levels, "policies": policies, "naive": args.naive, "overrides": args.overrides})
        if done:
            print(f"bench_concurrency.py: resuming: {len(done)} setting(s) measured before are kept")
        rows = concurrency_rows(
            args.overrides, levels, policies, args.naive, lambda row: _append(partial, row), done=done
        )
    except USER_ERRORS as exc:
        print(f"bench_concurrency.py: error: {exc}", file=sys.stderr)
        return 2
    table = Table(title="problems per hour by concurrency")
    for col in rows[0]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*["-" if v is None else str(v) for v in r.values()])
    Console(width=200).print(table)
    write_jsonl(out / "concurrency.jsonl", rows)
    write_csv(out / "concurrency.csv", rows)
    partial.unlink()
    (out / "concurrency.partial.args.json").unlink()
    return 0


def _resume(out: Path, run_args: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows an earlier attempt with the same arguments measured (its partial file); otherwise start
    the partial file over for these arguments. A torn last line (a kill mid-write) is dropped."""
    partial, saved = out / "concurrency.partial.jsonl", out / "concurrency.partial.args.json"
    if partial.is_file() and saved.is_file() and json.loads(saved.read_text()) == run_args:
        rows = []
        for line in partial.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
        partial.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return rows
    saved.write_text(json.dumps(run_args))
    partial.write_text("")
    return []


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
