"""What a block's scattered pieces cost a decode step (issue 23 item 3): after evictions a block's
kept tokens lie in many short runs of pool slots; each run read in place costs a kernel call and a
merge per layer, one packed copy costs its bytes. SmolLM2's attention shape (9 query / 3 KV heads,
head dim 64, 30 layers), a context of ``--tokens`` tokens in 1..P pieces, R rows decoding one token,
statistics on and off; milliseconds per step (all layers) packed and in place, medians of
``--repeats`` steps, the two alternating step by step in one run.

    python -m benchmarks.pieces --tokens 1024 --pieces 1,8,48 --rows 4 --out OUT.jsonl

With ``--search``, a live search instead (arbor-solve overrides after ``--``): ``full`` once (the
reference), then ``--policy`` at each ``--fractions`` of full's peak, packed and in place in turn:
wall time over full's, same tree as full, rehydrations.

    python -m benchmarks.pieces --search --fractions 0.25 --out OUT.jsonl -- model=smollm2 task=gsm8k ...
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from arbor_runtime.attention import Kernel
from arbor_runtime.attention import tree as tree_attention
from arbor_runtime.attention.call import AttentionCall
from arbor_runtime.attention.tree import TreeBatch
from arbor_runtime.batch import Group, Piece
from arbor_runtime.kv import DevicePool, KVShape

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM = 30, 3, 9, 64


def scattered(tokens: int, pieces: int) -> list[Piece]:
    """``tokens`` block tokens in ``pieces`` runs of slots with a one-slot gap between runs."""
    bounds = [round(i * tokens / pieces) for i in range(pieces + 1)]
    return [Piece(0, a + i, torch.arange(a, b)) for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


def step_ms(pool: DevicePool, pieces: list[Piece], rows: int, stats: bool, pack: bool) -> float:
    """Milliseconds of one decode step's attention over every layer."""
    tree_attention.PACK_BELOW_TOKENS = 512 if pack else 0
    base = pool.capacity - rows * 8
    own = torch.tensor([[base + 8 * r] for r in range(rows)])
    group = Group(0, None, rows, pieces)
    batch = TreeBatch(pool, [group], rows, 1, own, own, torch.ones(rows, 1, dtype=torch.bool), stats=stats)
    q = torch.randn(rows, Q_HEADS, 1, HEAD_DIM)
    kv = torch.randn(rows, KV_HEADS, 1, HEAD_DIM)
    start = time.perf_counter()
    for layer in range(LAYERS):
        batch.update(kv, kv, layer)
        batch.attend(layer, q, kv, kv, AttentionCall(HEAD_DIM**-0.5))
    return (time.perf_counter() - start) * 1e3


def paired_ms(pool: DevicePool, pieces: list[Piece], rows: int, stats: bool, repeats: int) -> tuple[float, float]:
    """Median ms of a step in place and packed, the two alternating step by step (they share the noise)."""
    inplace, packed = [], []
    for _ in range(repeats):
        inplace.append(step_ms(pool, pieces, rows, stats, False))
        packed.append(step_ms(pool, pieces, rows, stats, True))
    tree_attention.PACK_BELOW_TOKENS = 512
    return statistics.median(inplace), statistics.median(packed)


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
    row |= run.compare(ref) | {"rehydrations": m["rehydrations"]}  # same_tree, max_logprob_gap on shared nodes
    return row | {"forward_calls": m["forward_calls"], "peak_device_tokens": m["peak_device_tokens"]}


def micro_rows(tokens: int, counts: list[int], rows: int, repeats: int) -> list[dict]:
    """Packed vs in place, statistics off and on, for a block of ``tokens`` in each count of pieces."""
    torch.manual_seed(0)
    shape = KVShape(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"))
    pool = DevicePool(shape, tokens + max(counts) + rows * 8 + 8, fixed=True)
    pool.arenas[0].keys.normal_()
    pool.arenas[0].values.normal_()
    Kernel(shape.device)  # warm the kernel choice
    out = []
    print(f"{'pieces':>6} {'stats':>5} {'in place ms':>11} {'packed ms':>9} {'packed/in place':>15}")
    for n in counts:
        for stats in (False, True):
            pieces = scattered(tokens, n)
            paired_ms(pool, pieces, rows, stats, 2)  # warm-up
            inplace, packed = paired_ms(pool, pieces, rows, stats, repeats)
            row = {"tokens": tokens, "pieces": n, "rows": rows, "stats": stats, "repeats": repeats}
            row |= {"in_place_ms": round(inplace, 2), "packed_ms": round(packed, 2)}
            out.append(row | {"packed_vs_in_place": round(packed / inplace, 2)})
            print(f"{n:>6} {str(stats):>5} {inplace:>11.2f} {packed:>9.2f} {packed / inplace:>15.2f}")
    tree_attention.PACK_BELOW_TOKENS = 512
    return out


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
    ap.add_argument("--section", default=None, help="also write docs/data/SECTION/results.json (search + micro)")
    ap.add_argument("--search-rows", default=None, help="with --section: a finished --search run's JSONL")
    ap.add_argument("--search-command", default=None, help="the command that wrote --search-rows")
    ap.add_argument("--search-commit", default=None, help="the commit --search-rows were measured at")
    ap.add_argument("overrides", nargs="*", help="arbor-solve overrides (with --search)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    counts = [int(p) for p in args.pieces.split(",")]
    if args.search:
        found = search_rows(args.overrides, args.policy, [float(f) for f in args.fractions.split(",")])
        _write(args.out, found)
        if not args.section:
            return 0
    if args.section:
        if not args.search:
            if not args.search_rows:
                ap.error("--section needs --search or --search-rows")
            found = [json.loads(line) for line in open(args.search_rows, encoding="utf-8") if line.strip()]
        micro = micro_rows(args.tokens, counts, args.rows, args.repeats)
        _write_section(args.section, found, micro, args, argv)
        return 0
    _write(args.out, micro_rows(args.tokens, counts, args.rows, args.repeats))
    return 0


def _write_section(name: str, found: list[dict], micro: list[dict], args, argv: list[str] | None) -> None:
    from benchmarks.results.data import columns_for, write_section_data

    command = "python -m benchmarks.pieces " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.search_command:
        command = args.search_command + "\n" + command
    full = next(r for r in found if r["policy"] == "full")
    facts = {"full_seconds": full["seconds"], "full_peak_tokens": full["peak_device_tokens"]}
    for r in found:
        if r["policy"] != "full":
            facts[f"{'packed' if r['packed'] else 'in_place'}_vs_full"] = r["time_vs_full"]
    tables = {"micro": {"columns": columns_for(micro), "rows": micro}}
    title = "Reading evicted blocks: packed or in place (arbor at a quarter of full's peak)"
    settings = {"threads": args.threads, "search_commit": args.search_commit or "this one"}
    write_section_data(name, found, command, settings, title=title, tables=tables, facts=facts)


def _write(out: str | None, rows: list[dict]) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # a make results step starts from an empty folder
        with open(out, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    sys.exit(main())
