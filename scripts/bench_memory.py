"""Wide expansions over a shared prefix: profiler-measured peak allocation and decode tokens/s.

    python scripts/bench_memory.py --out bench/memory/after.json [--label after]

For each number of rows, a fresh runtime prefills one ``--prefix``-token prompt and expands it
into ``rows`` children of ``--new-tokens`` tokens each (sampled, no stop). Two measurements:

- memory: torch's profiler (``profile_memory=True``) over the expansion; the peak of all
  allocations summed in time order, as a multiple of the tree's KV bytes after the expansion
  (prompt + children). Memory allocated before the call (a budget's pool) is not in it.
- speed: the same expansion without the profiler, ``--repeats`` times; decode tokens/s =
  rows x new tokens / median seconds.

Only public runtime calls are used, so the same script measures an older checkout (run it with
that checkout first on PYTHONPATH) for a before/after table: ``--compare before.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from arbor_runtime import Runtime, SamplingParams, load_model

# benchmarks/ is beside the package, not in it; appended: an older checkout first on PYTHONPATH keeps its runtime
sys.path.append(str(Path(__file__).resolve().parents[1]))
try:
    from benchmarks.memprof import transient_peak_bytes
except ImportError:  # an older checkout on PYTHONPATH: the same measurement, inline
    from torch.profiler import ProfilerActivity, profile

    def transient_peak_bytes(fn):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
        events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
        running = peak = 0
        for event in events:
            running += event.self_cpu_memory_usage
            peak = max(peak, running)
        return peak, result


TEXT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Natalia sold 48/2 = 24 clips in May. "
    "Natalia sold 48+24 = 72 clips altogether in April and May. "
)


def prefix_ids(tokenizer, n: int) -> list[int]:
    ids = tokenizer(TEXT * (n // 20 + 1), add_special_tokens=True)["input_ids"]
    return ids[:n]


def one_expansion(loaded, ids, rows, params, policy):
    rt = Runtime(loaded, policy=policy)
    root = rt.new_tree_ids(ids)
    return rt, root


def measure(loaded, ids, rows, params, policy, repeats):
    rt, root = one_expansion(loaded, ids, rows, params, policy)
    peak, kids = transient_peak_bytes(lambda: rt.expand(root, rows, params))
    tree_tokens = root.length + sum(k.length for k in kids)
    bpt = rt.backend.shape.bytes_per_token
    seconds = []
    for _ in range(repeats):
        rt, root = one_expansion(loaded, ids, rows, params, policy)
        start = time.perf_counter()
        rt.expand(root, rows, params)
        seconds.append(time.perf_counter() - start)
    sec = statistics.median(seconds) if seconds else float("nan")
    return {
        "policy": policy,
        "rows": rows,
        "prefix_tokens": len(ids),
        "new_tokens": params.max_new_tokens,
        "peak_alloc_mb": peak / 2**20,
        "tree_kv_mb": tree_tokens * bpt / 2**20,
        "peak_over_tree_kv": peak / (tree_tokens * bpt),
        "seconds": sec,
        "decode_tokens_per_s": rows * params.max_new_tokens / sec,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prefix", type=int, default=600)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--policies", default="full,h2o")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per setting (0: memory only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--label", default="after")
    ap.add_argument("--compare", default=None, help="an earlier run's JSON to show side by side")
    ap.add_argument("--out", default="bench/memory/after.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    ids = prefix_ids(loaded.tokenizer, args.prefix)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop_at_eos=False, seed=0)
    rows = [
        measure(loaded, ids, r, params, p, args.repeats) | {"label": args.label}
        for p in args.policies.split(",")
        for r in map(int, args.rows.split(","))
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    before = {(r["policy"], r["rows"]): r for r in json.loads(Path(args.compare).read_text())} if args.compare else {}
    table = Table(title=f"{args.model}: {len(ids)}-token shared prefix, {args.new_tokens} new tokens per row")
    for col in ("policy", "rows", "peak alloc / tree KV", "peak alloc MB", "tokens/s"):
        table.add_column(col, justify="right")
    for r in rows:
        b = before.get((r["policy"], r["rows"]))
        cells = [_cell(b, r, k, f) for k, f in (("peak_over_tree_kv", "{:.2f}x"), ("peak_alloc_mb", "{:.1f}"))]
        table.add_row(r["policy"], str(r["rows"]), *cells, _cell(b, r, "decode_tokens_per_s", "{:.1f}"))
    Console().print(table)


def _cell(before: dict | None, now: dict, key: str, fmt: str) -> str:
    """``before -> now`` when there is a before, else ``now``."""
    return f"{fmt.format(before[key])} -> {fmt.format(now[key])}" if before else fmt.format(now[key])


if __name__ == "__main__":
    main()
