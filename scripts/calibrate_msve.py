"""Calibrate ArborKV's MSVE weights on leave-one-out block effects; writes the JSON arbor loads.

python scripts/calibrate_msve.py --model smollm2 --data-dir ../shared/data --game24 0:8 --gsm8k 0:4

Each task's trees can be recorded by its own process (``--gsm8k 0:0`` / ``--game24 0:0``, each with
``--samples``) and fitted together with ``--refit A.jsonl B.jsonl``; ``--section`` also writes the
results page's section (docs/data/msve-calibration: the held-out table and every sample).

Trees are grown by BFS that keeps its pruned branches, built from arbor-solve's config (the same
tasks, verifiers and seeds): Game of 24 rows outside the 900-1000 test slice and GSM8K *train*
questions. Without --data-dir, Game of 24 comes from the tree-of-thoughts-llm package and GSM8K
from the hub (see README: Data).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ is beside the package, not in it

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from arbor_cli.build import build, compose_config  # noqa: E402
from arbor_runtime.policies.msve import DEFAULT_CALIBRATION, SIGNALS  # noqa: E402
from research.msve import section  # noqa: E402
from research.msve.calibrate import calibration_record, collect, save  # noqa: E402


def span(text: str) -> tuple[int, int]:
    start, _, end = text.partition(":")
    return int(start), int(end)


def overrides(args: argparse.Namespace, task: str, rows: str, *extra: str) -> list[str]:
    """arbor-solve overrides of one calibration task: its rows, BFS keeping pruned branches, the model."""
    start, end = span(rows)
    data = [f"paths.data_dir={args.data_dir}"] if args.data_dir else []
    search = [f"controller.n_generate={args.n_generate}", f"controller.breadth={args.breadth}"]
    return [
        f"task={task}", f"task.start={start}", f"task.end={end}", *extra, *data, f"model.spec={args.model}",
        "controller=bfs", "controller.release_pruned=false", *search,
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data-dir", default=None, help="data folder (README: Data); default: package copy / hub")
    ap.add_argument("--game24", default="0:6", help="0-based rows of 24.csv (keep clear of the 900-1000 test slice)")
    ap.add_argument("--gsm8k", default="0:4", help="0-based rows of gsm8k/train.jsonl ('0:0' to skip)")
    ap.add_argument("--n-generate", type=int, default=3)
    ap.add_argument("--breadth", type=int, default=2)
    ap.add_argument("--outcome-pairs", type=int, default=8, help="verifier-outcome samples per tree")
    ap.add_argument("--out", default=str(DEFAULT_CALIBRATION))
    ap.add_argument(
        "--samples", default=None, help="also write every sample here (JSONL: task, tree, signals, effects)"
    )
    ap.add_argument(
        "--refit", nargs="+", default=None, help="fit the samples of earlier --samples files (no model, no search)"
    )
    ap.add_argument(
        "--baseline", default=str(DEFAULT_CALIBRATION),
        help="a calibration judged beside the new fits on the same held-out trees (default: the shipped one, "
        "read before --out is written; 'none' to skip)",
    )  # fmt: skip
    ap.add_argument("--section", action="store_true", help="also write docs/data/msve-calibration (results page)")
    args = ap.parse_args()
    for path in [*(args.refit or []), *([] if args.baseline == "none" else [args.baseline])]:
        if not Path(path).is_file():
            ap.error(f"{path}: no such file (--refit takes --samples files, --baseline a calibration JSON)")
    baseline = None if args.baseline == "none" else baseline_weights(ap, Path(args.baseline))
    if args.refit:
        samples = [s for path in args.refit for s in read_samples(Path(path))]
        meta = {"refit_of": " ".join(args.refit), "model": args.model} | meta_of(samples)
        finish(args, samples, meta, baseline)
        return
    # game24_oracle: the values the shipped calibration was fitted with (verifier-outcome drops)
    runs = [
        ("game24", args.game24, ["verifier=game24_oracle"]),
        ("gsm8k", args.gsm8k, ["task.split=train", "task.max_steps=3"]),
    ]
    samples, loaded = [], None
    with Progress() as progress:
        for task, rows, extra in runs:
            start, end = span(rows)
            if end > start:
                setup = build(compose_config(overrides(args, task, rows, *extra)), loaded=loaded)
                loaded = setup.loaded
                samples += collect(setup, progress, outcome_pairs=args.outcome_pairs)
    meta = {"model": args.model, "game24_rows": args.game24, "gsm8k_train_rows": args.gsm8k}
    meta |= {"n_generate": args.n_generate, "breadth": args.breadth, "outcome_pairs": args.outcome_pairs}
    if args.samples:
        Path(args.samples).write_text("".join(json.dumps(s | {"search": meta}) + "\n" for s in samples))
    finish(args, samples, meta, baseline)


def finish(args: argparse.Namespace, samples: list[dict], meta: dict, baseline: dict | None) -> None:
    """Fit, write --out (and the section with --section, first: its commit is the code that fitted, before
    --out changes a tracked file), print the summary."""
    record = calibration_record(samples, meta, baseline)
    if args.section:
        command = "python scripts/calibrate_msve.py " + " ".join(sys.argv[1:])
        Console().print(f"wrote {section.write(record, samples, command, baseline)}")
    save(record, Path(args.out))
    Console().print(summary(args.out, record))


def baseline_weights(ap: argparse.ArgumentParser, path: Path) -> dict:
    """The ``weights`` of the calibration JSON ``path`` (one line and exit 2 when it has none)."""
    try:
        weights = json.loads(path.read_text())["weights"]
        if set(weights) != {"bias", *SIGNALS}:
            raise KeyError("weights")
    except (ValueError, KeyError, TypeError):
        ap.error(f"--baseline {path}: not a calibration JSON (expected weights for bias, {', '.join(SIGNALS)})")
    return weights


def meta_of(samples: list[dict]) -> dict:
    """What the recording runs of refitted samples were (their ``search`` field: rows, n_generate,
    breadth, outcome pairs), per task's rows; the fields the runs share once."""
    runs = [json.loads(r) for r in {json.dumps(s["search"], sort_keys=True) for s in samples if s.get("search")}]
    out: dict = {}
    for key in ("game24_rows", "gsm8k_train_rows"):
        spans = sorted({r[key] for r in runs if span(r[key])[1] > span(r[key])[0]})
        if spans:
            out[key] = ",".join(spans)
    for key in ("model", "n_generate", "breadth", "outcome_pairs"):
        values = sorted({r[key] for r in runs})
        if values:
            out[key] = values[0] if len(values) == 1 else values
    return out


def read_samples(path: Path) -> list[dict]:
    """The samples of a ``--samples`` file (JSONL)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(out: str, record: dict) -> str:
    """One line per fit: in-sample r², then train / held-out r² per task and signal."""
    lines = [
        f"wrote {out}: {record['n_samples']} samples, in-sample R^2={record['r2']:.3f}, weights {record['weights']}"
    ]
    for task, entry in ((record.get("held_out") or {}).get("tasks") or {}).items():
        fits = ", ".join(
            f"{name} {_r2(entry[name]['train_r2'])}/{_r2(entry[name]['held_out_r2'])}"
            for name in ("all", *SIGNALS, "baseline") if name in entry
        )  # fmt: skip
        lines.append(
            f"  {task}: {entry['train_trees']} train / {entry['held_out_trees']} held-out trees; "
            f"r² train/held-out: {fits}"
        )
    return "\n".join(lines)


def _r2(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
