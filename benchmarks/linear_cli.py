"""Body of ``scripts/bench_linear.py``: the project's linear policies next to kvpress's presses."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from arbor_runtime import load_model
from arbor_runtime.policies import POLICIES
from arbor_runtime.policies.scorer import PER_HEAD_POLICIES
from benchmarks.cli import USER_ERRORS, make_console, parse_floats, set_threads
from benchmarks.linear import (
    COUNTERPARTS,
    DEFAULT_CONTEXTS,
    PRESSES,
    build_context,
    comparison,
    kvpress_model_dir,
    kvpress_python,
    prefill_cost,
    run_kvpress,
    run_project,
    summarize,
)

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench_linear.py",
        description="KL(full || compressed) and top-1 agreement of the project's linear policies and kvpress's "
        "presses on the same few-shot contexts (compress once, then teacher-force question + continuation).",
    )
    ap.add_argument("--out", default="bench/linear/linear.json", help="JSON with every per-step value and the table")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--contexts", default=",".join(DEFAULT_CONTEXTS), help="TASK:SHOTS:QUESTION,... (gsm8k|math500)")
    ap.add_argument("--shares", default="0.5,0.25,0.1", help="kept shares of the context, each in (0, 1)")
    ap.add_argument(
        "--policies",
        default=",".join(COUNTERPARTS),
        help="project policies (NAME@head: per-(layer, KV head) retention)",
    )
    ap.add_argument("--presses", default=",".join(PRESSES), help="kvpress presses")
    ap.add_argument("--steps", type=int, default=32, help="tokens of the reference continuation")
    ap.add_argument("--model", default="smollm2", help="smollm2 or a local model directory (both sides load it)")
    ap.add_argument("--kvpress-venv", default=str(REPO.parent / "venvs" / "kvpress"), help="venv with kvpress 0.5.5")
    ap.add_argument("--create-venv", action="store_true", help="create --kvpress-venv when it is missing")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads, both sides")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = parse_args(argv)
    console = console or make_console()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = bench(args, console)
    except USER_ERRORS as exc:
        print(f"bench_linear.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    console.print(linear_table(result["comparison"]))
    console.print(f"wrote {out}")
    return 0


def _choices(text: str, valid: Sequence[str], flag: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise ValueError(f"{flag} {text!r}: unknown {bad or 'empty'}; valid: {', '.join(valid)}")
    return names


def bench(args: argparse.Namespace, console: Console) -> dict:
    """Both sides on the same contexts; returns everything written to ``--out``."""
    set_threads(args.threads)
    shares = parse_floats(args.shares, "--shares")
    if any(not 0.0 < s < 1.0 for s in shares):
        raise ValueError(f"--shares {args.shares!r}: every kept share must be in (0, 1)")
    if args.steps < 1:
        raise ValueError(f"--steps={args.steps} must be >= 1")
    ratios = [round(1.0 - s, 6) for s in shares]
    heads = [f"{p}@head" for p in sorted(POLICIES) if p in PER_HEAD_POLICIES]
    policies = _choices(args.policies, sorted(POLICIES) + heads, "--policies")
    presses = _choices(args.presses, PRESSES, "--presses")
    model_dir = kvpress_model_dir(args.model) if args.model != "smollm2" else None
    python = kvpress_python(Path(args.kvpress_venv).expanduser(), args.create_venv)
    loaded = load_model(args.model, device="cpu")
    model_dir = model_dir or kvpress_model_dir(args.model)
    contexts = [build_context(loaded.tokenizer, Path(args.data_dir), spec) for spec in args.contexts.split(",")]
    for ctx in contexts:
        console.print(f"{ctx.name}: context {len(ctx.context_ids)} tokens, question {len(ctx.question_ids)}")
    start = time.perf_counter()
    project = run_project(loaded, contexts, policies, ratios, args.steps)
    project_seconds = time.perf_counter() - start
    request = {
        "model_dir": str(model_dir),
        "threads": args.threads,
        "compression_ratios": ratios,
        "presses": presses,
        "check": ["snapkv" if "snapkv" in presses else presses[0], ratios[0]],
        "items": [ctx.to_request() | {"reference": p["reference"]} for ctx, p in zip(contexts, project, strict=True)],
    }
    start = time.perf_counter()
    kvpress = run_kvpress(python, request)
    kvpress_seconds = time.perf_counter() - start
    rows = summarize(project, kvpress)
    return {
        "date": dt.date.today().isoformat(),
        "command": "python scripts/bench_linear.py " + " ".join(sys.argv[1:]),
        "threads": args.threads,
        "contexts": [
            {"name": c.name, "context_tokens": len(c.context_ids), "question_tokens": len(c.question_ids)}
            for c in contexts
        ],
        "steps": args.steps,
        "kvpress_versions": kvpress["versions"],
        "checks": [item["check"] for item in kvpress["items"]],
        "seconds": {"project": project_seconds, "kvpress": kvpress_seconds},
        "prefill_cost": prefill_cost(project, contexts),
        "rows": rows,
        "comparison": comparison(rows),
        "project": project,
        "kvpress": kvpress["items"],
    }


def linear_table(comparison_rows: list[dict]) -> Table:
    table = Table(title="mean KL(full || compressed) and top-1 over the continuation steps")
    for col in ("policy", "press", "kept", "KL", "top-1", "press KL", "press top-1", "token KL", "x press", "x token"):
        table.add_column(col, justify="left" if col in ("policy", "press") else "right")
    for r in comparison_rows:
        table.add_row(
            r["policy"],
            r["press"],
            f"{r['kept_share']:.0%}",
            f"{r['kl']:.4f}",
            f"{r['top1']:.3f}",
            f"{r['press_kl']:.4f}",
            f"{r['press_top1']:.3f}",
            "-" if r["token_kl"] is None else f"{r['token_kl']:.4f}",
            f"{r['ratio_vs_press']:.2f}",
            "-" if r["ratio_vs_token"] is None else f"{r['ratio_vs_token']:.2f}",
        )
    return table
