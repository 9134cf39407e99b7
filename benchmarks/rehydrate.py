"""Body of ``scripts/bench_rehydrate.py``: returning to a compressed branch under lychee over arbor,
with the branch made whole first (``rehydrate=whole``) or its evicted chunks brought back on demand
in the order decode retrieval wants them (``rehydrate=ranked``), against two orders that ignore the
index (``position``: the host tokens front to back; ``none``: nothing comes back).

The tree (SmolLM2, real text): a few-shot GSM8K root; branch A = worked GSM8K examples ending in
a new question; branch B = other examples and question. B is searched (two sampled answers), so
arbor compresses the inactive A to the host; then the search returns to A and samples ``--rows``
answers (content-seeded: the same logits give the same tokens). The reference is the same tree
under ``full`` (dense, no budget); ``lychee`` (over full, no budget) isolates what sparse reads
alone change. Three pool sizes: ``hi`` holds A's path whole with every row (ranked then makes it
whole too: only ``whole`` runs), ``mid`` holds it whole with one row (whole runs the rows in turn,
ranked starts them all on a partial path), ``lo`` holds A's prefill but not A with a row (whole
cannot run; ranked can).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from arbor_cli.results import append_jsonl, read_jsonl, write_csv
from arbor_runtime import Runtime, SamplingParams, load_model
from arbor_runtime.errors import KVBudgetExceeded
from arbor_runtime.policies import LycheePolicy
from arbor_runtime.tasks.data import DataSource, load_rows
from benchmarks.cli import USER_ERRORS, _console, _threads
from benchmarks.sparse import fewshot_ids

REPO = Path(__file__).resolve().parents[1]
MODES = ("whole", "ranked", "position", "none")
FIELDS = ("problem", "config", "pool_name", "pool", "status", "match", "prefix", "rehydrated", "host_at_return",
          "peak_device", "return_s")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_rehydrate.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/rehydrate", help="folder for rehydrate.jsonl / .csv")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="data folder (paths.data_dir)")
    ap.add_argument("--model", default="smollm2", help="model (arbor_runtime.load_model)")
    ap.add_argument("--problems", type=int, default=4, help="trees (A and B differ per problem)")
    ap.add_argument("--root", type=int, default=1024, help="root tokens (few-shot GSM8K)")
    ap.add_argument("--branch-a", type=int, default=448, help="tokens of branch A")
    ap.add_argument("--branch-b", type=int, default=192, help="tokens of branch B")
    ap.add_argument("--answer", type=int, default=32, help="tokens per answer on the return to A")
    ap.add_argument("--rows", type=int, default=4, help="answers sampled on the return to A")
    ap.add_argument("--token-budget", type=int, default=1024, help="context tokens a lychee query reads")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return ap.parse_args(argv)


def branch_ids(tokenizer, data_dir: str, first_row: int, length: int, question_row: int) -> list[int]:
    """``length`` token ids: GSM8K train examples from ``first_row`` on, then test question ``question_row``."""
    shots, _ = load_rows(DataSource("gsm8k", {"train": "train.jsonl"}), "train", data_dir, ("question", "answer"))
    tests, _ = load_rows(DataSource("gsm8k", {"test": "test.jsonl"}), "test", data_dir, ("question",))
    tail = tokenizer(f"\n\nQuestion: {tests[question_row]['question']}\nAnswer:", add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    for row in shots[first_row:]:
        ids += tokenizer(f"Question: {row['question']}\nAnswer: {row['answer']}\n\n", add_special_tokens=False)[
            "input_ids"
        ]
        if len(ids) + len(tail) >= length:
            return ids[: length - len(tail)] + tail
    raise ValueError(f"gsm8k train: not enough rows from {first_row} for {length} tokens")


def budget_for_pool(pool: int, reserve: float = 0.03) -> int:
    """Smallest budget_tokens whose pool (after lychee's index reserve) holds ``pool`` slots."""
    budget = pool
    while budget - math.ceil(reserve * budget) < pool:
        budget += 1
    return budget


def reorder(sparse, mode: str) -> None:
    """The two ablations of the on-demand order: host tokens front to back, or nothing back."""
    ranked = sparse.wanted

    def by_position():
        blocks = list(dict.fromkeys(block_id for block_id, _ in ranked()))
        out = []
        for block_id in blocks:
            idx = sparse.store.host.indices(block_id)
            if idx is not None:
                out += [(block_id, idx[i : i + 16]) for i in range(0, int(idx.numel()), 16)]
        return out

    sparse.wanted = by_position if mode == "position" else (lambda: (ranked(), [])[1])


def run_tree(loaded, ids: dict[str, list[int]], config: str, pool: int | None, args) -> dict[str, Any]:
    """Build the tree under one configuration and return to A; the answer's ids and what it cost."""
    if config == "full":
        policy: Any = "full"
    else:
        mode = "whole" if config == "lychee" else config
        budget = None if pool is None else budget_for_pool(pool)
        memory = "full" if config == "lychee" else "arbor"
        rehydrate = "whole" if mode == "whole" or memory == "full" else "ranked"
        policy = LycheePolicy(memory=memory, budget_tokens=budget, token_budget=args.token_budget, rehydrate=rehydrate)
    rt = Runtime(loaded, policy=policy)
    if config in ("position", "none"):
        reorder(rt.backend.sparse, config)
    root = rt.new_tree_ids(ids["root"], seed=0)
    a = rt.append_ids(root, ids["a"])
    b = rt.append_ids(root, ids["b"])
    rt.expand(b, 2, SamplingParams(max_new_tokens=32, temperature=0.7, stop_at_eos=False))
    host, before, start = rt.store.host_count(a.id), rt.store.counters.rehydrated_tokens, time.perf_counter()
    answers = rt.expand(a, args.rows, SamplingParams(max_new_tokens=args.answer, temperature=0.7, stop_at_eos=False))
    return {"ids": [n.token_ids for n in answers], "rehydrated": rt.store.counters.rehydrated_tokens - before,
            "host_at_return": host, "peak_device": rt.metrics.peak_device_tokens,
            "return_s": time.perf_counter() - start}  # fmt: skip


def bench(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    _threads(args.threads)
    loaded = load_model(args.model)
    out = Path(args.out)
    done = {(r["problem"], r["config"], r["pool"]) for r in read_jsonl(out / "rehydrate.jsonl")}
    rows = list(read_jsonl(out / "rehydrate.jsonl"))
    tok = loaded.tokenizer
    root = fewshot_ids(tok, args.data_dir, "gsm8k", args.root)
    for p in range(args.problems):
        ids = {"root": root, "a": branch_ids(tok, args.data_dir, 100 + 40 * p, args.branch_a, 1 + 2 * p),
               "b": branch_ids(tok, args.data_dir, 2000 + 40 * p, args.branch_b, 2 + 2 * p)}  # fmt: skip
        path = len(root) + args.branch_a
        hi, mid, lo = path + args.rows * args.answer + 16, path + args.answer + 16, path + 8
        plan = [("full", None, "-"), ("lychee", None, "-"), ("whole", hi, "hi")]
        plan += [(m, pool, name) for pool, name in ((mid, "mid"), (lo, "lo")) for m in MODES]
        reference = None
        for config, pool, name in plan:
            key = (p, config, pool)
            console.print(f"problem {p}: {config} pool={pool}")
            try:
                got = run_tree(loaded, ids, config, pool, args)
                status = "ok"
            except KVBudgetExceeded as exc:
                got, status = {}, f"OOM ({exc.needed} needed)"
            if config == "full":
                reference = got["ids"]
            if key in done:
                continue
            row = {"problem": p, "config": config, "pool": pool, "pool_name": name, "status": status}
            row |= score(got, reference)
            row |= {k: got.get(k) for k in ("rehydrated", "host_at_return", "peak_device", "return_s")}
            append_jsonl(out / "rehydrate.jsonl", row)
            rows.append(row)
    write_csv(out / "rehydrate.csv", rows, list(FIELDS))
    return rows


def score(got: dict[str, Any], reference: list[int] | None) -> dict[str, Any]:
    """Over the answers: share of tokens equal to the reference's at the same place, and the mean
    number of tokens before an answer's first difference."""
    if not got or reference is None:
        return {"match": None, "prefix": None}
    same, prefixes, total = 0, [], 0
    for mine, ref in zip(got["ids"], reference, strict=True):
        eq = [x == y for x, y in zip(mine, ref, strict=False)]
        same += sum(eq)
        total += len(ref)
        prefixes.append(eq.index(False) if False in eq else len(eq))
    return {"match": same / max(total, 1), "prefix": statistics.mean(prefixes)}


def summary_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Return to a compressed branch: lychee over arbor, by rehydration order")
    for col in ("config", "pool", "ran", "tokens = full", "tokens before 1st diff", "restored tokens", "A on host",
                "peak device", "return s"):  # fmt: skip
        table.add_column(col)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["config"], r["pool_name"]), []).append(r)
    for (config, pool), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        table.add_row(config, pool, f"{len(ok)}/{len(rs)}", *(_mean(ok, k) for k in
                      ("match", "prefix", "rehydrated", "host_at_return", "peak_device", "return_s")))  # fmt: skip
    return table


def _mean(rows: list[dict[str, Any]], key: str) -> str:
    vals = [r[key] for r in rows if r.get(key) is not None]
    if not vals:
        return "-"
    m = statistics.mean(vals)
    return f"{m:.2f}" if isinstance(vals[0], float) else f"{m:.1f}"


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = parse_args(argv)
    console = console or _console()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        rows = bench(args, console)
    except USER_ERRORS as exc:
        print(f"bench_rehydrate.py: error: {exc}", file=sys.stderr)
        return 2
    console.print(summary_table(rows))
    console.print(f"wrote {Path(args.out) / 'rehydrate.jsonl'} and rehydrate.csv")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
