"""Calibrate ArborKV's MSVE weights on leave-one-out block effects; writes the JSON arbor loads.

python scripts/calibrate_msve.py --model smollm2 --data-dir ../shared/data --game24 0:6 --gsm8k 0:4
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from arbor_cli.calibrate import collect, write_calibration
from arbor_runtime import load_model
from arbor_runtime.policies.msve import DEFAULT_CALIBRATION
from tasks.game24 import Game24Task
from tasks.gsm8k import GSM8KTask
from verifiers.answer_match import AnswerVerifier
from verifiers.game24 import Game24Verifier


def span(text: str) -> tuple[int, int]:
    start, _, end = text.partition(":")
    return int(start), int(end)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--game24", default="0:6", help="0-based rows of 24.csv (keep clear of the 900-1000 test slice)")
    ap.add_argument("--gsm8k", default="0:4", help="0-based rows of gsm8k/train.jsonl ('0:0' to skip)")
    ap.add_argument("--n-generate", type=int, default=3)
    ap.add_argument("--breadth", type=int, default=2)
    ap.add_argument("--outcome-pairs", type=int, default=8, help="verifier-outcome samples per tree")
    ap.add_argument("--out", default=str(DEFAULT_CALIBRATION))
    args = ap.parse_args()
    loaded = load_model(args.model)
    g_start, g_end = span(args.game24)
    s_start, s_end = span(args.gsm8k)
    bfs = {"n_generate": args.n_generate, "breadth": args.breadth, "outcome_pairs": args.outcome_pairs}
    samples = []
    with Progress() as progress:
        if g_end > g_start:
            task = Game24Task(data_dir=args.data_dir, start=g_start, end=g_end)
            samples += collect(loaded, task, Game24Verifier(), progress, **bfs)
        if s_end > s_start:
            task = GSM8KTask(data_dir=args.data_dir, split="train", start=s_start, end=s_end, max_steps=3)
            samples += collect(loaded, task, AnswerVerifier(), progress, **bfs)
    meta = {"model": args.model, "game24_rows": args.game24, "gsm8k_train_rows": args.gsm8k, **bfs}
    record = write_calibration(samples, Path(args.out), meta)
    Console().print(
        f"wrote {args.out}: {record['n_samples']} samples, R^2={record['r2']:.3f}, weights {record['weights']}"
    )


if __name__ == "__main__":
    main()
