"""Body of ``scripts/bench_longctx.py``: the RULER-style suite, dense vs sparse and compressed, by task and length."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.console import Console

from arbor_cli.report import fit_table
from arbor_cli.results import Column
from benchmarks.longctx.generator import TASKS, make_suite, records_example
from benchmarks.longctx.run import POLICIES, methods, run, summarise

PROG = "bench_longctx.py"
MODELS = ("smollm2", "tiny-random")


def _ints(text: str, what: str, least: int = 1) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < least:
        raise ValueError(f"--{what} {text!r} must be comma-separated integers >= {least}")
    return values


def _names(text: str, what: str, valid: Sequence[str]) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in valid] or ([] if names else [text])
    if bad:
        raise ValueError(f"--{what}: unknown {bad[0]!r}; valid: {', '.join(valid)}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__)
    ap.add_argument("--out", default="bench/longctx/longctx.json", help="the JSON file to write")
    ap.add_argument("--model", default="smollm2", help=f"one of {', '.join(MODELS)}")
    ap.add_argument("--lengths", default="2048,4096,8192", help="target prompt lengths in tokens")
    ap.add_argument("--items", default="20", help="items per task and length")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated: {', '.join(TASKS)}")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated: {', '.join(POLICIES)}")
    budgets = "budgets: a share of the context in (0, 1), a token count, or 'default' (lychee/quest at their defaults)"
    ap.add_argument("--shares", default="0.5,0.25,0.1", help=budgets)
    ap.add_argument("--max-new", default="16", help="greedy answer tokens at most")
    ap.add_argument("--seed", default="0", help="the suite's seed")
    ap.add_argument("--threads", default=None, help="torch CPU threads")
    ap.add_argument(
        "--example", action="store_true", help="run issue 24's records example alone (240 records, record 39)"
    )
    return ap.parse_args(argv)


def validate(args: argparse.Namespace) -> dict:
    """The run's settings from the arguments; ValueError names a bad value (before any model loads)."""
    if args.model not in MODELS:
        raise ValueError(f"--model {args.model!r} is not one of {', '.join(MODELS)}")
    return {
        "model": args.model,
        "lengths": _ints(args.lengths, "lengths", 16),
        "items": _ints(args.items, "items")[0],
        "tasks": _names(args.tasks, "tasks", tuple(TASKS)),
        "plan": methods(_names(args.policies, "policies", POLICIES), [s for s in args.shares.split(",") if s.strip()]),
        "max_new": _ints(args.max_new, "max-new")[0],
        "seed": _ints(args.seed, "seed", 0)[0],
        "threads": None if args.threads is None else _ints(args.threads, "threads")[0],
        "example": bool(args.example),
    }


COLUMNS = (
    Column("task", "task", label=True),
    Column("length", "length", "{:,}"),
    Column("method", "method", label=True),
    Column("items", "n", rank=2),
    Column("accuracy", "acc", "{:.2f}"),
    Column("agree", "agree", "{:.2f}"),
    Column("first_agree", "1st agree", "{:.2f}", rank=1),
    Column("kl_first", "KL 1st", "{:.3f}", rank=1),
    Column("decode_tok_s", "tok/s", "{:.1f}", rank=1),
)


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = parse_args(argv)
    console = console or Console()
    try:
        cfg = validate(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    from arbor_runtime import load_model  # after validation: a bad argument never waits for the model

    if cfg["threads"] is not None:
        torch.set_num_threads(cfg["threads"])
    loaded = load_model(cfg["model"], device="cpu")
    start = time.perf_counter()
    if cfg["example"]:
        items = [records_example(loaded.tokenizer, seed=cfg["seed"])]
    else:
        items = make_suite(cfg["tasks"], cfg["lengths"], cfg["items"], loaded.tokenizer, cfg["seed"])
    console.print(f"{len(items)} items generated in {time.perf_counter() - start:.1f} s")

    def progress(i, item):
        console.print(f"[{i + 1}/{len(items)}] {item.task} {item.length} #{item.index} ({item.tokens} tokens)")

    command = f"python scripts/{PROG} " + " ".join(sys.argv[1:] if argv is None else argv)
    settings = {k: v for k, v in cfg.items() if k != "plan"} | {"methods": [m.label for m in cfg["plan"]]}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(rows, complete: bool = False):  # after every item: a long run leaves what it measured
        out = {
            "command": command, "settings": settings, "threads": torch.get_num_threads(), "complete": complete,
            "items": [{k: v for k, v in it.to_dict().items() if k != "context"} for it in items],
            "rows": rows, "summary": summarise(rows),
        }  # fmt: skip
        path.write_text(json.dumps(out, indent=1) + "\n")
        return out

    try:
        rows = run(loaded, items, cfg["plan"], cfg["max_new"], progress, write)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    summary = write(rows, complete=True)["summary"]
    console.print(fit_table(summary, COLUMNS, f"long-context fidelity · {cfg['model']}", console.width))
    console.print(f"wrote {path}")
    return 0
