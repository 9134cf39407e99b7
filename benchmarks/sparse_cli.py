"""Body of ``scripts/bench_sparse.py``: sparse decode attention (lychee, quest) vs dense by context length."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from arbor_cli.report import fit_table
from arbor_cli.results import Column, write_csv, write_jsonl
from arbor_runtime import load_model
from benchmarks.cli import USER_ERRORS, make_console, set_threads
from benchmarks.random_model import random_model, smollm2_shape_config
from benchmarks.sparse import (
    METHODS,
    SOURCES,
    VARIANTS,
    SparseSettings,
    fewshot_ids,
    measure_fidelity,
    measure_speed,
    median_row,
    prefilled,
)

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
COLUMNS = (
    Column("model", "model", label=True),
    Column("context", "context", "{:,}"),
    Column("method", "method", label=True),
    Column("decode_tok_s", "decode tok/s (CPU)", "{:.2f}"),
    Column("decode_tok_s_wall", "(wall)", "{:.2f}", rank=2),
    Column("speedup", "x dense", "{:.2f}"),
    Column("attn_ms_step", "attn ms/step", "{:.1f}"),
    Column("attn_speedup", "attn x dense", "{:.2f}"),
    Column("index_ms_step", "index ms", "{:.1f}", rank=1),
    Column("sparse_attn_ms_step", "sparse attn ms", "{:.1f}", rank=1),
    Column("build_s", "build s", "{:.2f}", rank=2),
    Column("read_fraction", "read", "{:.1%}", rank=1),
    Column("index_pct", "index % KV", "{:.2f}"),
    Column("top1_gsm8k", "top-1 gsm8k", "{:.3f}"),
    Column("kl_gsm8k", "KL gsm8k", "{:.4f}"),
    Column("top1_math500", "top-1 math", "{:.3f}"),
    Column("kl_math500", "KL math", "{:.4f}"),
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench_sparse.py",
        description="Decode speed and next-token fidelity of sparse attention (lychee, quest) vs dense attention.",
    )
    ap.add_argument("--out", default="bench/sparse", help="folder for sparse.jsonl and sparse.csv")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="data folder (paths.data_dir)")
    ap.add_argument("--model", default="smollm2", help="model of the real-weight contexts (arbor_runtime.load_model)")
    ap.add_argument("--contexts", default="2048,4096,8192", help="context lengths with --model (speed + fidelity)")
    ap.add_argument("--random-contexts", default="16384,32768", help="lengths with a random SmolLM2-shaped model")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated: {', '.join(METHODS + VARIANTS)}")
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"few-shot sources for fidelity: {', '.join(SOURCES)}")
    ap.add_argument("--decode", type=int, default=32, help="greedy tokens per speed measurement")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved speed rounds per context (medians)")
    ap.add_argument("--fidelity-steps", type=int, default=16, help="decode steps compared per source and context")
    ap.add_argument("--token-budget", type=int, default=1024, help="context tokens a sparse query reads")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = parse_args(argv)
    args.command = "python scripts/bench_sparse.py " + " ".join(sys.argv[1:] if argv is None else argv)
    console = console or make_console()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        rows = bench(args, console)
    except USER_ERRORS as exc:
        print(f"bench_sparse.py: error: {exc}", file=sys.stderr)
        return 2
    out = save(rows, Path(args.out))
    console.print(sparse_table(rows, console.width))
    console.print(f"wrote {out / 'sparse.jsonl'} and {out / 'sparse.csv'}")
    return 0


def save(rows: list[dict[str, Any]], out: Path) -> Path:
    """Write ``rows`` to ``out``/sparse.jsonl and sparse.csv (after every context: long runs keep what they did)."""
    write_jsonl(out / "sparse.jsonl", rows)
    write_csv(out / "sparse.csv", rows, [c.key for c in COLUMNS])
    return out


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: comma-separated token counts expected") from None
    if any(v < 64 for v in values):
        raise ValueError(f"{flag} {text!r}: every context must be >= 64 tokens")
    return values


def _names(text: str, valid: Sequence[str], flag: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise ValueError(f"{flag} {text!r}: unknown {bad or 'empty'}; valid: {', '.join(valid)}")
    return names


def bench(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    """Every (model, context, method) row, fidelity columns on the real-weight contexts."""
    set_threads(args.threads)
    contexts, longer = _ints(args.contexts, "--contexts"), _ints(args.random_contexts, "--random-contexts")
    methods = _names(args.methods, METHODS + VARIANTS, "--methods")
    sources = _names(args.sources, list(SOURCES), "--sources")
    if args.decode < 2 or args.fidelity_steps < 1 or args.repeats < 1:
        steps = f"--fidelity-steps={args.fidelity_steps} and --repeats={args.repeats}"
        raise ValueError(f"--decode={args.decode} must be >= 2, {steps} >= 1")
    settings = SparseSettings(token_budget=args.token_budget)
    meta = {
        "date": dt.date.today().isoformat(),
        "command": args.command,
        "threads": torch.get_num_threads(),
        "token_budget": args.token_budget,
    }
    rows = []
    if contexts:
        loaded = load_model(args.model, device="cpu")
        for length in contexts:
            rows += [meta | r for r in context_rows(loaded, args, length, methods, sources, settings, console)]
            save(rows, Path(args.out))
    if longer:
        loaded = random_model(smollm2_shape_config(max(longer) + args.decode + 8), "cpu", torch.float32)
        for length in longer:
            rt, root, seconds = prefilled(loaded, list(range(length)), True)
            console.print(f"random {length}: prefilled in {seconds:.1f} s (synthetic K/V)")
            rows += [meta | r for r in speed_rows(rt, root, "random", length, methods, args.decode, args.repeats,
                                                  settings, console)]  # fmt: skip
            save(rows, Path(args.out))
            del rt, root
    return rows


def context_rows(loaded, args, length, methods, sources, settings, console) -> list[dict[str, Any]]:
    """Speed on the first source's context, fidelity on every source's (one prefill per source)."""
    rows: list[dict[str, Any]] = []
    for source in sources:
        rt, root, seconds = prefilled(loaded, fewshot_ids(loaded.tokenizer, args.data_dir, source, length), False)
        console.print(f"{loaded.spec} {length}: {source} context prefilled in {seconds:.1f} s")
        if not rows:
            rows = speed_rows(rt, root, loaded.spec, length, methods, args.decode, args.repeats, settings, console)
        by_method = {r["method"]: r for r in rows}
        for method in methods:
            if method != "dense":
                fid = measure_fidelity(rt, root, method, settings, args.fidelity_steps)
                by_method[method] |= {f"top1_{source}": fid["top1"], f"kl_{source}": fid["kl"],
                                      f"max_kl_{source}": fid["max_kl"]}  # fmt: skip
    return rows


def speed_rows(rt, root, model, length, methods, tokens, repeats, settings, console) -> list[dict[str, Any]]:
    """Decode speed of every method on one prefilled context (medians of interleaved rounds), ratios to dense."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for _ in range(repeats):  # interleaved rounds: load on a shared machine hits every method alike
        for method in methods:
            runs[method].append(measure_speed(rt, root, method, settings, tokens))
    rows = []
    for method in methods:
        row = {"model": model, "context": length} | median_row(runs[method])
        console.print(f"  {method}: {row['decode_tok_s']:.2f} tok/s, attention {row['attn_ms_step']:.1f} ms/step")
        rows.append(row)
    dense = next((r for r in rows if r["method"] == "dense"), None)
    for row in rows:
        if dense is not None:
            row["speedup"] = row["decode_tok_s"] / dense["decode_tok_s"]
            row["attn_speedup"] = dense["attn_ms_step"] / row["attn_ms_step"]
    return rows


def sparse_table(rows: Sequence[dict[str, Any]], width: int = 160) -> Table:
    title = "sparse decode attention vs dense (per decode step; index and build timed apart)"
    return fit_table(rows, COLUMNS, title, width)
