"""What a block's scattered pieces cost a decode step (issue 23 item 3): after evictions a block's
kept tokens lie in many short runs of pool slots; each run read in place costs a kernel call and a
merge per layer, one packed copy costs its bytes. SmolLM2's attention shape (9 query / 3 KV heads,
head dim 64, 30 layers), a context of ``--tokens`` tokens in 1..P pieces, R rows decoding one token,
statistics on and off; milliseconds per step (all layers) packed and in place, medians of
``--repeats`` steps, side by side in one run.

    python -m benchmarks.pieces --tokens 1024 --pieces 1,8,48 --rows 4 --out OUT.jsonl

With ``--search``, a live search instead (arbor-solve overrides after ``--``): ``full`` once (the
reference), then ``--policy`` at each ``--fractions`` of full's peak, packed and in place in turn:
wall time over full's, same tree as full, rehydrations.

    python -m benchmarks.pieces --search --fractions 0.25 --out OUT.jsonl -- model=smollm2 task=gsm8k ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from arbor_runtime.attention import Kernel
from arbor_runtime.attention import tree as tree_attention
from arbor_runtime.backend import Group, Piece, TreeBatch
from arbor_runtime.kv import DevicePool, KVShape

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM = 30, 3, 9, 64


def scattered(tokens: int, pieces: int) -> list[Piece]:
    """``tokens`` block tokens in ``pieces`` runs of slots with a one-slot gap between runs."""
    bounds = [round(i * tokens / pieces) for i in range(pieces + 1)]
    return [Piece(0, a + i, torch.arange(a, b)) for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


def step_ms(pool: DevicePool, pieces: list[Piece], rows: int, stats: bool, pack: bool, repeats: int) -> float:
    """Median milliseconds of one decode step's attention over every layer."""
    tree_attention.PACK_BELOW_TOKENS = 512 if pack else 0
    base = pool.capacity - rows * 8
    own = torch.tensor([[base + 8 * r] for r in range(rows)])
    times = []
    for _ in range(repeats):
        group = Group(0, None, rows, pieces)
        batch = TreeBatch(pool, [group], rows, 1, own, own, torch.ones(rows, 1, dtype=torch.bool), stats=stats)
        q = torch.randn(rows, Q_HEADS, 1, HEAD_DIM)
        kv = torch.randn(rows, KV_HEADS, 1, HEAD_DIM)
        start = time.perf_counter()
        for layer in range(LAYERS):
            batch.update(kv, kv, layer)
            batch.attend(layer, q, kv, kv, HEAD_DIM**-0.5)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def search_rows(overrides: list[str], policy: str, fractions: list[float]) -> list[dict]:
    """full, then ``policy`` at each fraction of full's peak, packed and in place in turn."""
    import math

    from arbor_cli.build import build, compose_config
    from benchmarks.budgets import SearchRun, run_search

    setup = build(compose_config(overrides))
    rows = []
    for problem in setup.problems:
        seed = setup.seed(problem)
        tree_attention.PACK_BELOW_TOKENS = 512
        ref: SearchRun = run_search(setup.loaded, setup.controller, problem, "full", None, seed)
        peak = int(ref.metrics["peak_device_tokens"])
        rows.append(_search_row(problem.index, "full", None, ref, ref))
        print(json.dumps(rows[-1]), flush=True)
        for fraction in fractions:
            budget = math.ceil(fraction * peak)
            for pack in (True, False):
                tree_attention.PACK_BELOW_TOKENS = 512 if pack else 0
                run = run_search(setup.loaded, setup.controller, problem, policy, budget, seed)
                rows.append(_search_row(problem.index, policy, pack, run, ref) | {"fraction": fraction})
                print(json.dumps(rows[-1]), flush=True)
    tree_attention.PACK_BELOW_TOKENS = 512
    return rows


def _search_row(index: int, policy: str, pack: bool | None, run, ref) -> dict:
    m = run.metrics
    row = {"problem": index, "policy": policy, "packed": pack, "budget": run.budget, "oom": run.oom is not None}
    row |= {"seconds": round(run.seconds, 1), "time_vs_full": round(run.seconds / ref.seconds, 2)}
    row |= {"same_tree": run.compare(ref)["same_tree"], "rehydrations": m["rehydrations"]}
    return row | {"forward_calls": m["forward_calls"], "peak_device_tokens": m["peak_device_tokens"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--pieces", default="1,8,48")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSONL of the rows (else only the table)")
    ap.add_argument("--search", action="store_true", help="a live search (overrides after --)")
    ap.add_argument("--policy", default="arbor")
    ap.add_argument("--fractions", default="0.25")
    ap.add_argument("overrides", nargs="*", help="arbor-solve overrides (with --search)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.search:
        rows = search_rows(args.overrides, args.policy, [float(f) for f in args.fractions.split(",")])
        _write(args.out, rows)
        return 0
    torch.manual_seed(0)
    counts = [int(p) for p in args.pieces.split(",")]
    shape = KVShape(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"))
    pool = DevicePool(shape, args.tokens + max(counts) + args.rows * 8 + 8, fixed=True)
    pool.arenas[0].keys.normal_()
    pool.arenas[0].values.normal_()
    Kernel(shape.device)  # warm the kernel choice
    rows = []
    print(f"{'pieces':>6} {'stats':>5} {'in place ms':>11} {'packed ms':>9} {'packed/in place':>15}")
    for n in counts:
        for stats in (False, True):
            pieces = scattered(args.tokens, n)
            step_ms(pool, pieces, args.rows, stats, True, 2)  # warm-up
            inplace = step_ms(pool, pieces, args.rows, stats, False, args.repeats)
            packed = step_ms(pool, pieces, args.rows, stats, True, args.repeats)
            row = {"tokens": args.tokens, "pieces": n, "rows": args.rows, "stats": stats}
            row |= {"in_place_ms": round(inplace, 2), "packed_ms": round(packed, 2), "repeats": args.repeats}
            rows.append(row)
            print(f"{n:>6} {str(stats):>5} {inplace:>11.2f} {packed:>9.2f} {packed / inplace:>15.2f}")
    _write(args.out, rows)
    return 0


def _write(out: str | None, rows: list[dict]) -> None:
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    sys.exit(main())
