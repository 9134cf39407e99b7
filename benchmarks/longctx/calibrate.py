"""Calibrate ``dense_layers="auto"`` for a model: the layers whose sparse read alone loses dense's answer,
which lychee then reads whole (issue 49: on SmolLM2 at 8K, layer 7 drops a copied number's last digit).

    python -m benchmarks.longctx.calibrate --model smollm2 --seed 1 --lost 4 --write

Over the suite's items (``--tasks`` in turn, indices from ``--first``): dense's greedy answer and lychee's
with every layer sparse; where dense answers correctly and sparse does not (``--any-parting``: wherever they
part), the all-layer sweep of :mod:`benchmarks.longctx.layer_ablation` at the parting step (each layer alone
read whole). It stops after ``--lost`` such items, or after ``--items`` indices per task. The default tasks
are the retrievals a small model answers (on SmolLM2 at 8K, dense is right on most of them).
:func:`choose_layers` picks the layers; a table shows each layer's count. ``--rows`` keeps the sweep's
rows (JSONL); ``--write`` records the choice for the model's fingerprint in ``dense_layers.json`` of the
cache folder (``$ARBOR_CACHE_DIR``), which ``dense_layers="auto"`` reads before the shipped table
(``arbor_runtime/sparse/calibrated.py``).

Costly: per item one dense prefill and two answers; per item swept, two forced decodes per layer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.longctx.generator import TASKS
from benchmarks.longctx.layer_ablation import DEFAULT_KNOBS


def item_of(row: dict) -> tuple:
    """The suite item a sweep row belongs to."""
    return row["task"], row["length"], row["index"], row["seed"]


def layer_counts(rows: Sequence[dict]) -> dict[int, dict[str, float]]:
    """Per layer of the sweep rows' ``whole:L`` cases: ``fixed``, the items whose margin layer L read whole
    turns positive (dense's token wins), and ``recovered``, the mean over items of the share of dense's
    margin it brings back, (whole:L - sparse) / (dense - sparse), over items where dense's exceeds sparse's."""
    margin = {(item_of(r), r["case"]): r["margin"] for r in rows}
    items = sorted({item_of(r) for r in rows})
    layers = sorted({int(r["case"].split(":")[1]) for r in rows if r["case"].startswith("whole:")})
    out = {}
    for layer in layers:
        whole = [(it, margin[it, f"whole:{layer}"]) for it in items if (it, f"whole:{layer}") in margin]
        shares = [
            (m - margin[it, "sparse"]) / (margin[it, "dense"] - margin[it, "sparse"])
            for it, m in whole
            if margin[it, "dense"] > margin[it, "sparse"]
        ]
        out[layer] = {"fixed": sum(m > 0 for _, m in whole), "recovered": sum(shares) / len(shares) if shares else 0.0}
    return out


def choose_layers(rows: Sequence[dict], share: float = 0.5, most: int = 2) -> list[int]:
    """The layers to read whole: of the layers ranked by items fixed (then share recovered, then index),
    the first ``most`` that each fix at least ``share`` of the items that parted (at least one); none
    when no item parted or no layer alone fixes enough of them (the loss is spread: no layer to name)."""
    lost = {item_of(r) for r in rows}
    if not lost:
        return []
    need = max(1, math.ceil(share * len(lost)))
    counts = layer_counts(rows)
    ranked = sorted(counts, key=lambda layer: (-counts[layer]["fixed"], -counts[layer]["recovered"], layer))
    return sorted(layer for layer in ranked[:most] if counts[layer]["fixed"] >= need)


def suite_items(tasks: Sequence[str], first: int, items: int) -> list[tuple[str, int]]:
    """(task, index) in the order the calibration visits them: each index across the tasks in turn."""
    return [(task, index) for index in range(first, first + items) for task in tasks]


def sweep(loaded, cfg: dict, progress=print) -> tuple[list[dict], int]:
    """The sweep rows of the first ``cfg['lost']`` items whose every-layer-sparse answer loses dense's
    correct answer (``cfg['lost_only']``; else parts from dense's answer at all), and how many items were tried."""
    from benchmarks.longctx.layer_ablation import run_item

    rows, lost, tried = [], 0, 0
    for task, index in suite_items(cfg["tasks"], cfg["first"], cfg["items"]):
        if lost >= cfg["lost"]:
            break
        tried += 1
        found = run_item(
            loaded, task, index, None, cfg["knobs"], cfg["length"], cfg["seed"], echo=False, lost_only=cfg["lost_only"]
        )
        lost += bool(found)
        rows += found
        said = "parts from dense" if found else "nothing to sweep"
        progress(f"[{tried}] {task} #{index}: {said} ({lost} of {cfg['lost']})")
    return rows, tried


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="what load_model takes: smollm2, tiny-random, a path")
    ap.add_argument("--tasks", default="niah_single_number,niah_multikey,niah_single_word,niah_single_uuid",
                    help=f"comma-separated, of {', '.join(TASKS)}")  # fmt: skip
    ap.add_argument("--length", type=int, default=8160, help="prompt length in tokens")
    ap.add_argument("--seed", type=int, default=0, help="the suite's seed")
    ap.add_argument("--first", type=int, default=0, help="the first item index")
    ap.add_argument("--items", type=int, default=20, help="item indices per task at most")
    ap.add_argument("--lost", type=int, default=4, help="stop after this many items lose dense's answer")
    ap.add_argument("--any-parting", action="store_true",
                    help="sweep every item whose sparse answer parts from dense's, not only those where dense is "
                    "correct and sparse is not (a model that answers nothing right, as a random one)")  # fmt: skip
    ap.add_argument("--share", type=float, default=0.5, help="a layer must fix this share of those items")
    ap.add_argument("--most", type=int, default=2, help="layers chosen at most")
    ap.add_argument("--policy", default="", help="lychee knobs, k=v+... (default: its default read, token_share=0.15)")
    ap.add_argument("--rows", help="JSONL file the sweep's rows are appended to")
    ap.add_argument("--write", action="store_true", help="record the choice in the cache folder's dense_layers.json")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return ap.parse_args(argv)


def validate(args: argparse.Namespace) -> dict:
    """The run's settings; ValueError naming a bad value (before the model loads)."""
    tasks = [t for t in args.tasks.split(",") if t]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise ValueError(f"--tasks {args.tasks!r}: tasks are {', '.join(TASKS)}")
    for name in ("length", "items", "lost", "most", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} {getattr(args, name)} must be >= 1")
    if args.first < 0:
        raise ValueError(f"--first {args.first} must be >= 0")
    if not 0.0 < args.share <= 1.0:
        raise ValueError(f"--share {args.share} must be in (0, 1]")
    return {
        "model": args.model, "tasks": tasks, "length": args.length, "seed": args.seed, "first": args.first,
        "items": args.items, "lost": args.lost, "knobs": DEFAULT_KNOBS | parse_knobs(args.policy),
        "lost_only": not args.any_parting,
    }  # fmt: skip


def parse_knobs(text: str) -> dict:
    """``k=v+...`` (as the suite's ``lychee:k=v+...`` variants) -> lychee knobs; ValueError naming a bad
    one, or ``dense_layers`` (what is calibrated)."""
    from benchmarks.longctx.run import sparse_policy

    knobs = dict(sparse_policy(f"lychee:{text}").keywords)
    if "dense_layers" in knobs:
        raise ValueError("--policy: dense_layers is what the calibration chooses; leave it out")
    return knobs


def report(counts: dict[int, dict[str, float]], chosen: list[int], lost: int, tried: int, console) -> None:
    """A table of each layer's items fixed and margin recovered, the chosen layers marked."""
    from rich.table import Table

    table = Table(title=f"layers read whole alone: {lost} of {tried} items swept")
    for name in ("layer", "items fixed", "margin recovered", "chosen"):
        table.add_column(name, justify="right")
    for layer, c in sorted(counts.items(), key=lambda kv: (-kv[1]["fixed"], -kv[1]["recovered"], kv[0])):
        mark = "yes" if layer in chosen else ""
        table.add_row(str(layer), f"{int(c['fixed'])}/{lost}", f"{c['recovered']:.2f}", mark)
    console.print(table)
    console.print(f"dense_layers for this model: {chosen}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = validate(args)
    except ValueError as err:
        print(f"calibrate: {err}", file=sys.stderr)
        return 2
    import torch
    from rich.console import Console

    from arbor_runtime import load_model
    from arbor_runtime.loading import ModelSpecError
    from arbor_runtime.sparse.calibrated import DenseLayers, write_calibration

    console = Console(stderr=True)
    torch.set_num_threads(args.threads)
    try:
        loaded = load_model(cfg["model"], device="cpu")
    except ModelSpecError as err:
        print(f"calibrate: --model {cfg['model']!r}: {err}", file=sys.stderr)
        return 2
    rows, tried = sweep(loaded, cfg, progress=console.print)
    if args.rows:
        with open(args.rows, "a") as out:
            out.writelines(json.dumps(r) + "\n" for r in rows)
    lost = len({item_of(r) for r in rows})
    chosen = choose_layers(rows, args.share, args.most)
    report(layer_counts(rows), chosen, lost, tried, console)
    if args.write:
        today = datetime.date.today().isoformat()
        command = "python -m benchmarks.longctx.calibrate " + " ".join(sys.argv[1:] if argv is None else argv)
        entry = DenseLayers(cfg["model"], tuple(chosen), f"{command} ({today}; {lost} of {tried} items swept)")
        path = write_calibration(loaded.model, entry)
        console.print(f"written to {Path(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
