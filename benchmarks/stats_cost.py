"""What attention statistics cost per token: prefill and decode under a statistics policy vs ``full``.

    python scripts/bench_stats_cost.py --out bench/linear/stats_cost.json --threads 2

One process, one model, runs interleaved (full, h2o, snapkv, full, h2o, ...), medians over
``--repeats``; times are the process's CPU time (wall-time ratios are kept too: on a shared
machine they mostly measure the neighbours). Prefill: a fresh runtime prefills
one few-shot context (``new_tree_ids``). Decode: it then expands ``--rows`` greedy children of
``--new-tokens`` tokens each. No budget, so nothing is evicted: the difference is the statistics
pass (h2o: every query; snapkv: the last 64 queries of the prefill, none while decoding).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from arbor_runtime import Runtime, SamplingParams, load_model
from benchmarks.cli import USER_ERRORS, make_console, set_threads
from benchmarks.linear import build_context
from benchmarks.linear_cli import REPO

POLICIES = ("full", "h2o", "snapkv")


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def measure(loaded, context_ids: list[int], policy: str, rows: int, new_tokens: int) -> dict[str, float]:
    """Wall and CPU seconds of one fresh runtime's prefill and expansion."""
    rt = Runtime(loaded, policy)
    wall, cpu = _clocks()
    root = rt.new_tree_ids(context_ids)
    wall_p, cpu_p = _clocks()
    rt.expand(root, rows, SamplingParams(max_new_tokens=new_tokens, temperature=0.0, stop_at_eos=False))
    wall_e, cpu_e = _clocks()
    return {
        "prefill_wall": wall_p - wall,
        "prefill_cpu": cpu_p - cpu,
        "expand_wall": wall_e - wall_p,
        "expand_cpu": cpu_e - cpu_p,
    }


def stats_cost(loaded, context_ids: list[int], repeats: int, rows: int, new_tokens: int) -> dict:
    """Per policy, medians over ``repeats`` interleaved runs: per-token milliseconds (CPU time of
    this process, which a busy machine disturbs far less than wall time) and ratios to ``full``."""
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    measure(loaded, context_ids[:64], "full", 1, 2)  # warm-up
    for _ in range(repeats):
        for policy in POLICIES:
            runs[policy].append(measure(loaded, context_ids, policy, rows, new_tokens))
    per_token = {"prefill": len(context_ids), "expand": rows * new_tokens}
    out = {"context_tokens": len(context_ids), "rows": rows, "new_tokens": new_tokens, "repeats": repeats}
    med = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in runs.items()}
    out["policies"] = {}
    for policy, m in med.items():
        row = {}
        for phase, n in per_token.items():
            row[f"{phase}_ms_per_token"] = 1000 * m[f"{phase}_cpu"] / n
            row[f"{phase}_vs_full"] = m[f"{phase}_cpu"] / med["full"][f"{phase}_cpu"]
            row[f"{phase}_wall_vs_full"] = m[f"{phase}_wall"] / med["full"][f"{phase}_wall"]
        out["policies"][policy] = row | {"medians": m}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_stats_cost.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/linear/stats_cost.json")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--context", default="gsm8k:10:1", help="TASK:SHOTS:QUESTION (see bench_linear.py)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    console = make_console()
    try:
        set_threads(args.threads)
        if min(args.repeats, args.rows, args.new_tokens) < 1:
            counts = f"{args.repeats}/{args.rows}/{args.new_tokens}"
            raise ValueError(f"--repeats/--rows/--new-tokens {counts}: each must be >= 1")
        loaded = load_model(args.model, device="cpu")
        ctx = build_context(loaded.tokenizer, Path(args.data_dir), args.context)
        result = stats_cost(loaded, ctx.context_ids, args.repeats, args.rows, args.new_tokens)
    except USER_ERRORS as exc:
        print(f"bench_stats_cost.py: error: {exc}", file=sys.stderr)
        return 2
    result |= {"context": args.context, "threads": args.threads}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    for policy, m in result["policies"].items():
        console.print(
            f"{policy:8s} prefill {m['prefill_ms_per_token']:.2f} ms/token (x{m['prefill_vs_full']:.2f}), "
            f"decode {m['expand_ms_per_token']:.1f} ms/token (x{m['expand_vs_full']:.2f})"
        )
    console.print(f"wrote {out}")
    return 0
