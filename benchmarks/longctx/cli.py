"""Body of ``scripts/bench_longctx.py``: the RULER-style suite, dense vs sparse and compressed, by task and length."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.console import Console

from arbor_cli.provenance import checkout_commit
from arbor_cli.report import fit_table
from arbor_cli.results import Column
from arbor_runtime.sparse import native
from benchmarks.longctx.generator import TASKS, make_suite, records_example
from benchmarks.longctx.run import POLICIES, PROTOCOL, check_policy, item_key, methods, run, summarise

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


def _policies(text: str, what: str) -> list[str]:
    """Comma-separated policies of the suite, sparse variants included (``lychee:max_chunk_tokens=4``)."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise ValueError(f"--{what}: unknown {text!r}; valid: {', '.join(POLICIES)}")
    for name in names:
        try:
            check_policy(name)
        except ValueError as err:
            raise ValueError(f"--{what}: {err}") from None
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__)
    ap.add_argument("--out", default="bench/longctx/ruler_summary.json", help="the summary JSON to write")
    ap.add_argument(
        "--rows", default=None, help="the rows JSONL, appended after every item; a run resumes from it "
        "(default: ruler_rows.jsonl beside --out)"
    )  # fmt: skip
    ap.add_argument(
        "--redo", default="", help="comma-separated policies whose rows of this run's items are dropped first and "
        f"measured again (e.g. lychee,quest after a retrieval change); of {', '.join(POLICIES)}"
    )  # fmt: skip
    ap.add_argument(
        "--answer-prefix", action=argparse.BooleanOptionalAction, default=True,
        help="questions end in RULER's answer prefix after 'Answer:' (' The special magic number for K "
        "mentioned in the provided text is'), as RULER prompts: the answer is the value, not a restatement "
        "of the question (default; --no-answer-prefix: the question ends in 'Answer:'; use its own --rows)",
    )  # fmt: skip
    ap.add_argument(
        "--summary-only",
        action="store_true",
        help="rebuild --out from --rows; no model, nothing runs (rows "
        "that repeat an item and method, from overlapping runs joined, are kept once, the first)",
    )
    ap.add_argument(
        "--runs-from", default="", help="with --summary-only: comma-separated summaries whose runs (commands, "
        "commits, dates) and machine the new summary records (rows of several runs joined into one --rows file; "
        "default: --out's own)"
    )  # fmt: skip
    ap.add_argument("--no-reuse-prefill", action="store_true", help="kvp/streaming prefill anew (same rows, slower)")
    ap.add_argument("--model", default="smollm2", help=f"one of {', '.join(MODELS)}")
    ap.add_argument("--lengths", default="2048,4096,8160", help="target prompt lengths in tokens")
    ap.add_argument("--items", default="20", help="items per task and length")
    ap.add_argument(
        "--first", default="0", help="the first item index to run (items --first .. --items - 1: runs over "
        "disjoint ranges in parallel, each with its own --rows, joined later with --summary-only --runs-from)"
    )  # fmt: skip
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated: {', '.join(TASKS)}")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated: {', '.join(POLICIES)}")
    budgets = "budgets: a share of the context in (0, 1), a token count, or 'default' (lychee/quest at their defaults)"
    ap.add_argument("--shares", default="0.5,0.25,0.1", help=budgets)
    ap.add_argument("--max-new", default="24", help="greedy answer tokens at most")
    ap.add_argument("--seed", default="0", help="the suite's seed")
    ap.add_argument("--weights", default="dense", help="the model's weight format (load_model's weights=)")
    ap.add_argument("--threads", default=None, help="torch CPU threads")
    ap.add_argument(
        "--example", action="store_true", help="run issue 24's records example alone (240 records, record 39)"
    )
    return ap.parse_args(argv)


def _weights(value: str) -> str:
    from arbor_runtime.weights import FORMATS

    if value not in FORMATS:
        raise ValueError(f"--weights {value!r} is not one of {', '.join(FORMATS)}")
    return value


def validate(args: argparse.Namespace) -> dict:
    """The run's settings from the arguments; ValueError names a bad value (before any model loads)."""
    if args.model not in MODELS:
        raise ValueError(f"--model {args.model!r} is not one of {', '.join(MODELS)}")
    if _ints(args.first, "first", 0)[0] >= _ints(args.items, "items")[0]:
        raise ValueError(f"--first {args.first} must be below --items {args.items} (items --first .. --items - 1)")
    return {
        "model": args.model,
        "lengths": _ints(args.lengths, "lengths", 16),
        "items": _ints(args.items, "items")[0],
        "first": _ints(args.first, "first", 0)[0],
        "tasks": _names(args.tasks, "tasks", tuple(TASKS)),
        "plan": methods(_policies(args.policies, "policies"), [s for s in args.shares.split(",") if s.strip()]),
        "max_new": _ints(args.max_new, "max-new")[0],
        "seed": _ints(args.seed, "seed", 0)[0],
        "threads": None if args.threads is None else _ints(args.threads, "threads")[0],
        "weights": _weights(args.weights),
        "example": bool(args.example),
        "redo": _policies(args.redo, "redo") if args.redo.strip() else [],
        "reuse_prefill": not args.no_reuse_prefill,
        "prefix": bool(args.answer_prefix),
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


def provenance(argv: Sequence[str] | None) -> dict:
    """Where and how the data was made: the command, the commit, the date, the machine."""
    code = checkout_commit(Path(__file__).resolve().parents[2]) or ""
    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        pass
    import transformers

    return {
        "command": f"python scripts/{PROG} " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": code.removesuffix("+dirty"), "dirty": code.endswith("+dirty"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu or platform.processor(), "cores": os.cpu_count(), "system": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(),
        },
    }  # fmt: skip


def read_rows(path: Path) -> list[dict]:
    """Rows of a rows JSONL (none when it does not exist); a torn last line (a killed run) is dropped."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n != len(lines) - 1:
                raise ValueError(f"{path}: line {n + 1} is not JSON") from None
    return rows


def unique_rows(rows: Sequence[dict]) -> tuple[list[dict], int, int]:
    """``rows`` with one row per item and method (the first; rows files of overlapping runs joined
    hold some twice), the number of repeats dropped, and how many of those answered otherwise than
    the row kept (0 for reruns of one commit: the suite is greedy and deterministic)."""
    kept: dict[tuple, dict] = {}
    dropped = differing = 0
    for r in rows:
        key = (*item_key(r), r["method"])
        if key not in kept:
            kept[key] = r
            continue
        dropped += 1
        differing += r.get("answer") != kept[key].get("answer")
    return list(kept.values()), dropped, differing


def write_rows(path: Path, rows: Sequence[dict], mode: str = "a") -> None:
    with path.open(mode) as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_summary(path: Path, rows: Sequence[dict], meta: dict, planned: int | None) -> dict:
    """The summary JSON of ``rows`` (all of the rows file) with ``meta``; ``complete`` when the plan's
    ``planned`` rows are all there (None: unknown, a summary rebuilt from rows alone)."""
    out = meta | {
        "rows": len(rows), "planned": planned,
        "complete": None if planned is None else len(rows) >= planned,
        "summary": summarise(rows),
    }  # fmt: skip
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(path)
    return out


def rows_settings(rows: Sequence[dict]) -> dict:
    """The settings a rows file holds: model, max_new, seed, and the tasks, lengths and methods it has rows of."""

    def seen(key: str) -> list:
        return list(dict.fromkeys(r.get(key) for r in rows))

    return {
        "model": seen("model"), "max_new": seen("max_new"), "seed": seen("seed"), "prefix": seen("prefix"),
        "tasks": seen("task"),
        "lengths": sorted(set(seen("length"))), "methods": seen("method"), "commits": seen("commit"),
    }  # fmt: skip


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = parse_args(argv)
    console = console or Console()
    try:
        cfg = validate(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    rows_path = Path(args.rows) if args.rows else out.with_name("ruler_rows.jsonl")
    if rows_path.resolve() == out.resolve():
        print(f"{PROG}: error: --rows {rows_path} is the summary file --out", file=sys.stderr)
        return 2
    try:
        old = read_rows(rows_path)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    mismatch = [r for r in old if (r.get("model"), r.get("max_new"), r.get("seed"), r.get("prefix", False),
                                   r.get("protocol", 1), r.get("weights", "dense"))
                != (cfg["model"], cfg["max_new"], cfg["seed"], cfg["prefix"], PROTOCOL, cfg["weights"])]  # fmt: skip
    if mismatch and not args.summary_only:
        r = mismatch[0]
        print(
            f"{PROG}: error: --rows {rows_path} holds rows of model={r.get('model')} max_new={r.get('max_new')} "
            f"seed={r.get('seed')} prefix={r.get('prefix', False)} protocol={r.get('protocol', 1)} "
            f"weights={r.get('weights', 'dense')}, not {cfg['model']} / {cfg['max_new']} / {cfg['seed']} / "
            f"{cfg['prefix']} / {PROTOCOL} / {cfg['weights']}: use another --rows",
            file=sys.stderr,
        )
        return 2
    old, dropped, differing = unique_rows(old)
    if dropped:  # counted once each, or the overlap would weigh twice in every proportion (and in a resume)
        console.print(
            f"{rows_path}: {dropped} repeated rows (an item and method already there) left out, "
            f"{differing} of them with another answer than the row kept; the file keeps the first of each"
        )
    settings = {k: v for k, v in cfg.items() if k != "plan"} | {"methods": [m.label for m in cfg["plan"]]}
    meta = provenance(argv) | {"settings": settings, "rows_file": rows_path.name}
    runs = []  # every run that wrote to this rows file: its command, commit and date (from the summary before)
    if out.exists() and old:
        try:
            runs = json.loads(out.read_text()).get("runs", [])
        except json.JSONDecodeError:
            runs = []
    if not args.summary_only:
        meta["runs"] = runs + [{k: meta[k] for k in ("command", "commit", "dirty", "date")}]
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.summary_only:  # what the rows hold, not the (unused) run arguments; earlier runs' commands kept
        if dropped:  # the run path rewrites the file below, with its torn line
            write_rows(rows_path, old, "w")
        meta["settings"] = rows_settings(old)
        sources = [Path(f) for f in args.runs_from.split(",") if f.strip()] or ([out] if out.exists() else [])
        if sources:  # the runs that made the rows, and the machine they ran on (not this one)
            previous = [json.loads(f.read_text()) for f in sources]
            meta["runs"] = [run for p in previous for run in p.get("runs", [])]
            meta["machine"] = previous[0].get("machine", meta["machine"])
        data = write_summary(out, old, meta, None)
        console.print(fit_table(data["summary"], COLUMNS, "long-context fidelity (from rows)", console.width))
        console.print(f"wrote {out} from {len(old)} rows of {rows_path}")
        return 0
    if rows_path.exists() and sum(1 for ln in rows_path.read_text().splitlines() if ln.strip()) != len(old):
        write_rows(rows_path, old, "w")  # a torn last line or repeats go before rows are appended after them
    from arbor_runtime import load_model  # after validation: a bad argument never waits for the model

    if cfg["threads"] is not None:
        torch.set_num_threads(cfg["threads"])
    meta["machine"]["torch_threads"] = torch.get_num_threads()
    loaded = load_model(cfg["model"], device="cpu", weights=cfg["weights"])
    start = time.perf_counter()
    if cfg["example"]:
        items = [records_example(loaded.tokenizer, seed=cfg["seed"])]
    else:
        items = make_suite(
            cfg["tasks"], cfg["lengths"], cfg["items"], loaded.tokenizer, cfg["seed"], cfg["prefix"], cfg["first"]
        )
        # item-major: an interrupted run has about as many items of every task and length
        items.sort(key=lambda it: (it.index, cfg["lengths"].index(it.length), cfg["tasks"].index(it.task)))
    console.print(f"{len(items)} items generated in {time.perf_counter() - start:.1f} s")
    if cfg["redo"]:  # only rows of this run's items: other lengths / tasks keep theirs
        keys = {item_key(it) for it in items}
        kept = [r for r in old if r["policy"] not in cfg["redo"] or item_key(r) not in keys]
        write_rows(rows_path, kept, "w")
        console.print(f"--redo {','.join(cfg['redo'])}: dropped {len(old) - len(kept)} rows of {rows_path}")
        old = kept
    have: dict[tuple, set[str]] = defaultdict(set)
    for r in old:
        have[item_key(r)].add(r["method"])
    labels = {m.label for m in cfg["plan"]}
    planned = sum(1 for r in old if item_key(r) not in {item_key(it) for it in items} or r["method"] not in labels)
    planned += len(items) * len(labels)
    rows = list(old)
    meta["machine"]["sparse_kernels"] = native.warm()  # built or loaded before any timed decode (native.py)
    started = time.perf_counter()

    def progress(i, item, todo):
        if not todo:
            return
        console.print(
            f"[{i + 1}/{len(items)}] {item.task} {item.length} #{item.index} ({item.tokens} tokens): "
            f"{len(todo)} methods, {time.perf_counter() - started:.0f} s"
        )

    def done(new):  # after every item: a long run leaves what it measured, and resumes from it
        for r in new:
            r["model"], r["commit"], r["prefix"], r["protocol"] = cfg["model"], meta["commit"], cfg["prefix"], PROTOCOL
            r["weights"] = cfg["weights"]
        write_rows(rows_path, new)
        rows.extend(new)
        write_summary(out, rows, meta, planned)

    try:
        run(loaded, items, cfg["plan"], cfg["max_new"], progress, done, have, cfg["reuse_prefill"])
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    data = write_summary(out, rows, meta, planned)
    console.print(fit_table(data["summary"], COLUMNS, f"long-context fidelity · {cfg['model']}", console.width))
    console.print(f"wrote {out} and {rows_path} ({len(rows)} rows, {time.perf_counter() - started:.0f} s)")
    return 0
