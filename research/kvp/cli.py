"""Bodies of ``scripts/kvp_collect.py`` and ``scripts/kvp_train.py``: argv in, exit code out."""

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
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from arbor_cli.build import USER_ERRORS
from arbor_runtime import load_model
from arbor_runtime.policies import POLICIES
from arbor_runtime.policies.kvp_scorer import ScorerShape
from arbor_runtime.policies.kvp_weights import save_weights
from arbor_runtime.policies.scorer import GRANULARITIES, PER_HEAD_POLICIES
from benchmarks.cli import parse_floats, set_threads
from benchmarks.linear import DEFAULT_CONTEXTS, build_context
from benchmarks.trace import load_trace
from research.kvp.bench import DEFAULT_POLICIES, PROTOCOLS, policy_variant, run_context, scoring_cost, summarize
from research.kvp.collect import collect, read_shards, shard_fingerprint
from research.kvp.plots import plot_training
from research.kvp.replay import selector_replay
from research.kvp.texts import training_texts
from research.kvp.train import LOSSES, TrainConfig, evaluate, train

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
BASELINES = ("recency", "streaming", "knorm")


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def collect_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="kvp_collect.py",
        description="Run the model over training texts (GSM8K train, Game of 24 outside 900-999) and store per "
        "layer and KV head the context K/V and the future attention each token receives (safetensors shards).",
    )
    ap.add_argument("--out", default="bench/kvp/data", help="folder for shard-NNNN.safetensors and summary.json")
    ap.add_argument("--model", default="smollm2", help="model spec (load_model)")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--sequences", type=int, default=200, help="sequences to collect")
    ap.add_argument("--min-context", type=int, default=192, help="fewest context tokens per sequence")
    ap.add_argument("--max-context", type=int, default=576, help="most context tokens per sequence (about)")
    ap.add_argument("--game24-share", type=float, default=0.25, help="share of Game of 24 sequences")
    ap.add_argument("--max-gb", type=float, default=3.0, help="disk cap for the shards (GB); stops early")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return ap.parse_args(argv)


def collect_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = collect_args(argv)
    console = console or Console()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        summary = run_collect(args, console)
    except USER_ERRORS as exc:
        print(f"kvp_collect.py: error: {exc}", file=sys.stderr)
        return 2
    console.print(
        f"{summary['sequences']} sequences, {summary['tokens']:,} tokens, {summary['bytes'] / 1e9:.2f} GB "
        f"in {len(summary['shards'])} shards ({summary['seconds']:.0f} s){' - cap hit' if summary['capped'] else ''}"
    )
    return 0


def run_collect(args: argparse.Namespace, console: Console) -> dict:
    """Validate the arguments, collect, write ``summary.json`` next to the shards."""
    if args.sequences < 1 or not 8 <= args.min_context <= args.max_context:
        raise ValueError(f"--sequences={args.sequences} must be >= 1 and 8 <= --min-context <= --max-context")
    if not 0.0 <= args.game24_share <= 1.0 or args.max_gb <= 0:
        raise ValueError(f"--game24-share={args.game24_share} must be in [0, 1] and --max-gb={args.max_gb} > 0")
    set_threads(args.threads)
    loaded = load_model(args.model, device="cpu")
    tok = loaded.tokenizer

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=True)["input_ids"])

    texts = list(
        training_texts(
            Path(args.data_dir), args.sequences, args.seed, args.min_context, args.max_context, count, args.game24_share
        )
    )
    out = Path(args.out)
    start = time.perf_counter()
    with progress_bar(console) as bar:
        task = bar.add_task("collect", total=len(texts), info="")
        total = [0]

        def advance(done: int, tokens: int) -> None:
            total[0] += tokens
            bar.update(task, completed=done, info=f"{total[0]:,} tokens")

        summary = collect(loaded, texts, out, int(args.max_gb * 1e9), advance)
    summary |= {
        "seconds": time.perf_counter() - start,
        "model": args.model,
        "command": "python scripts/kvp_collect.py " + " ".join(sys.argv[1:]),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# ---- training --------------------------------------------------------------------------------
DEFAULT_WEIGHTS = REPO / "arbor_runtime" / "policies" / "weights" / "kvp-smollm2.safetensors"


def train_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="kvp_train.py",
        description="Train per-layer, per-KV-head KVP scorers on collected shards (all budgets 10..90%% at once); "
        "writes one safetensors weights file, a PNG training curve and a JSON report.",
    )
    ap.add_argument("--data", default="bench/kvp/data", help="folder of kvp_collect.py shards")
    ap.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="weights file to write")
    ap.add_argument("--plot", default="bench/kvp/train.png", help="training curve PNG")
    ap.add_argument("--report", default="bench/kvp/train.json", help="JSON: settings, curve, held-out metrics")
    ap.add_argument("--loss", default="listnet", choices=LOSSES, help="ranking loss (see research/kvp/train.py)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--val-share", type=float, default=0.1, help="share of sequences held out (the last ones)")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    ap.add_argument("--embed", type=int, default=32, help="scorer projection width")
    ap.add_argument("--hidden", type=int, default=32, help="scorer MLP width")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return ap.parse_args(argv)


def train_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = train_args(argv)
    console = console or Console()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        report = run_train(args, console)
    except USER_ERRORS as exc:
        print(f"kvp_train.py: error: {exc}", file=sys.stderr)
        return 2
    final = report["final"]
    console.print(
        f"trained in {report['seconds']:.0f} s; held-out retained-mass AUC per head {final['kvp/head_auc']:.3f} "
        f"(oracle {final['oracle/head_auc']:.3f}, recency {final['recency/head_auc']:.3f}), per token "
        f"{final['kvp/token_auc']:.3f}; wrote {args.out}, {args.plot}, {args.report}"
    )
    return 0


def run_train(args: argparse.Namespace, console: Console) -> dict:
    """Read shards, split off the held-out tail, train, evaluate against the heuristics, write outputs."""
    if not 0.0 <= args.val_share < 1.0:
        raise ValueError(f"--val-share={args.val_share} must be in [0, 1)")
    set_threads(args.threads)
    fingerprint = shard_fingerprint(Path(args.data))
    seqs = read_shards(Path(args.data), fingerprint)
    n_val = int(round(len(seqs) * args.val_share))
    train_seqs, val_seqs = seqs[: len(seqs) - n_val], seqs[len(seqs) - n_val :]
    layers, heads, _, dim = seqs[0].keys.shape
    shape = ScorerShape(layers, heads, dim, args.embed, args.hidden)
    cfg = TrainConfig(
        args.loss,
        args.epochs,
        args.lr,
        eval_every=args.eval_every,
        seed=args.seed,
        embed=args.embed,
        hidden=args.hidden,
    )
    with progress_bar(console) as bar:
        task = bar.add_task(f"train ({args.loss})", total=cfg.epochs * len(train_seqs), info="")

        def on_step(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, info=f"loss {loss:.4f}")

        result = train(shape, train_seqs, val_seqs, cfg, on_step)
    final = evaluate(result.scorer, val_seqs or train_seqs, BASELINES)
    report = {
        "command": "python scripts/kvp_train.py " + " ".join(sys.argv[1:]),
        "model_fingerprint": fingerprint,
        "settings": vars(args),
        "sequences": {
            "train": len(train_seqs),
            "held_out": len(val_seqs),
            "train_tokens": sum(s.attention.shape[-1] for s in train_seqs),
        },
        "seconds": result.seconds,
        "losses": result.losses,
        "evals": result.evals,
        "final": final,
    }
    info = {k: report[k] for k in ("command", "sequences", "seconds", "final")} | {"loss": args.loss}
    save_weights(args.out, result.scorer, fingerprint, info)
    plot_training(result, final, Path(args.plot), args.loss)
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(report))
    return report


# ---- benchmark -------------------------------------------------------------------------------
def bench_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench_kvp.py",
        description="kvp vs h2o / snapkv / streaming on held-out few-shot contexts (bench_linear's protocol): "
        "retained future attention, KL(full || compressed) and top-1 per kept share; kvp's scoring cost per step.",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="JSON with every per-step value and the table "
        "(default bench/kvp/bench.json; with --protocol budget bench/kvp/bench-budget.json)",
    )
    ap.add_argument(
        "--protocol",
        default="compress",
        choices=PROTOCOLS,
        help="compress: prefill the context whole, compress once, teacher-force with nothing evicted; "
        "budget: the budget (kept share of the context) set from the start, the context prefilled "
        "in chunks and compressed while it grows, question + continuation under the same budget",
    )
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--contexts", default=",".join(DEFAULT_CONTEXTS), help="TASK:SHOTS:QUESTION,... (gsm8k|math500)")
    ap.add_argument("--shares", default="0.1,0.2,0.5", help="kept shares of the context, each in (0, 1)")
    ap.add_argument(
        "--policies", default=",".join(DEFAULT_POLICIES), help="project policies; NAME@head: per-(layer, KV head)"
    )
    ap.add_argument(
        "--variants",
        default="",
        help="extra kvp runs NAME=WEIGHTS or NAME=recent_ratio:X,... (e.g. kvp-pure=recent_ratio:0)",
    )
    ap.add_argument("--steps", type=int, default=32, help="tokens of the reference continuation")
    ap.add_argument("--model", default="smollm2", help="model spec")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return ap.parse_args(argv)


def bench_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = bench_args(argv)
    if args.out is None:
        args.out = "bench/kvp/bench.json" if args.protocol == "compress" else "bench/kvp/bench-budget.json"
    console = console or Console()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = run_bench(args, console)
    except USER_ERRORS as exc:
        print(f"bench_kvp.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    console.print(kvp_table(result["rows"], args.protocol))
    if result["cost"]:
        console.print(f"kvp scoring per decode step: {result['cost']}")
    console.print(f"wrote {out}")
    return 0


def valid_bench_policy(name: str) -> bool:
    """A project policy, or ``NAME@head`` / ``NAME@token`` for a policy that can keep tokens per (layer, KV
    head) (``@token`` names its whole-token retention explicitly)."""
    kind, kwargs = policy_variant(name)
    return kind in POLICIES and (not kwargs or (kwargs["granularity"] in GRANULARITIES and kind in PER_HEAD_POLICIES))


def _variant_name(name: str, item: str) -> dict[str, str]:
    """``NAME@head`` / ``NAME@token`` -> the kvp variant's granularity argument; a plain NAME -> {}."""
    _, at, granularity = name.partition("@")
    if at and granularity not in GRANULARITIES:
        valid = ", ".join("@" + g for g in GRANULARITIES)
        raise ValueError(f"--variants item {item!r}: @{granularity}; valid: {valid}")
    return {"granularity": granularity} if at else {}


def parse_variants(text: str) -> dict[str, dict]:
    """Items ``NAME=WEIGHTS`` (a weights file) or ``NAME=recent_ratio:X`` -> KVPPolicy arguments per name;
    a NAME ending ``@head`` (or ``@token``) runs that variant at that retention granularity."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        key, _, ratio = value.partition(":")
        if sep and name and key == "recent_ratio":
            try:
                out[name] = {"recent_ratio": float(ratio)} | _variant_name(name, item)
            except ValueError:
                raise ValueError(f"--variants item {item!r}: recent_ratio:{ratio!r} is not a number") from None
            continue
        if not sep or not name or not Path(value).is_file():
            raise ValueError(
                f"--variants item {item!r} must be NAME=PATH of an existing weights file or NAME=recent_ratio:X"
            )
        out[name] = {"weights": value} | _variant_name(name, item)
    return out


def run_bench(args: argparse.Namespace, console: Console) -> dict:
    """Validate, run every context, summarize; returns everything written to ``--out``."""
    set_threads(args.threads)
    shares = parse_floats(args.shares, "--shares")
    if any(not 0.0 < s < 1.0 for s in shares) or args.steps < 1:
        raise ValueError(f"--shares {args.shares!r} must be in (0, 1) and --steps={args.steps} >= 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if not valid_bench_policy(p)]
    if bad or not policies:
        raise ValueError(
            f"--policies {args.policies!r}: unknown {bad or 'empty'}; valid: {', '.join(sorted(POLICIES))}, "
            f"each as NAME, or NAME@head / NAME@token for {', '.join(PER_HEAD_POLICIES)} (per-(layer, KV head) or "
            "whole-token retention)"
        )
    variants = parse_variants(args.variants)
    ratios = [round(1.0 - s, 6) for s in shares]
    loaded = load_model(args.model, device="cpu")
    contexts = [build_context(loaded.tokenizer, Path(args.data_dir), spec) for spec in args.contexts.split(",")]
    start, results = time.perf_counter(), []
    with progress_bar(console) as bar:
        task = bar.add_task("contexts", total=len(contexts), info="")
        for ctx in contexts:
            bar.update(task, info=f"{ctx.name} ({len(ctx.context_ids)} tokens)")
            results.append(run_context(loaded, ctx, policies, ratios, args.steps, variants, args.protocol))
            bar.advance(task)
    seconds = time.perf_counter() - start
    cost = scoring_cost(loaded, contexts[-1]) if "kvp" in policies and args.protocol == "compress" else {}
    return {
        "date": dt.date.today().isoformat(),
        "command": "python scripts/bench_kvp.py " + " ".join(sys.argv[1:]),
        "threads": args.threads,
        "protocol": args.protocol,
        "steps": args.steps,
        "contexts": [{"name": c.name, "context_tokens": len(c.context_ids)} for c in contexts],
        "seconds": seconds,
        "cost": (cost | {"context": contexts[-1].name}) if cost else {},
        "rows": summarize(results),
        "per_context": results,
    }


def kvp_table(rows: list[dict], protocol: str = "compress") -> Table:
    table = Table(
        title=f"protocol {protocol}: retained future attention, KL(full || compressed), top-1 "
        "(mean over contexts and steps)"
    )
    for col in ("kept", "policy", "retained", "KL", "top-1"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        kl = f"{r['mean_kl']:.4f}" if "mean_kl" in r else "-"
        top1 = f"{r['top1']:.3f}" if "top1" in r else "-"
        table.add_row(f"{r['kept_share']:.0%}", r["policy"], f"{r['retained']:.3f}", kl, top1)
    return table


# ---- arbor's token selector, trace replay ----------------------------------------------------
def replay_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``bench_kvp_replay.py TRACE...``: arbor vs arbor+kvp replay fidelity, rows to ``--out`` (JSONL)."""
    ap = argparse.ArgumentParser(prog="bench_kvp_replay.py", description=replay_main.__doc__)
    ap.add_argument("traces", nargs="+", help="trace JSON files from scripts/record_trace.py")
    ap.add_argument("--fractions", default="0.3,0.5,0.7", help="budgets as shares of the full replay peak")
    ap.add_argument("--out", default="bench/kvp/replay.jsonl")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    console = console or Console()
    try:
        set_threads(args.threads)
        fractions = parse_floats(args.fractions, "--fractions")
        loaded = load_model(args.model, device="cpu")
        rows = [row for path in args.traces for row in selector_replay(loaded, load_trace(path), fractions)]
    except USER_ERRORS as exc:
        print(f"bench_kvp_replay.py: error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = Table(title="arbor's in-block token selector: replay fidelity vs full")
    for col in ("problem", "selector", "budget", "top-1", "mean KL", "peak KV", "rehydrated", "oom"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["problem"]),
            r["policy"],
            f"{r['budget_fraction']:.0%}",
            _fmt(r.get("top1_agreement")),
            _fmt(r.get("mean_kl")),
            str(r["peak_device_tokens"]),
            str(r["rehydrated_tokens"]),
            str(r["oom"]),
        )
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"
