"""Merge the jobs of an `arbor-solve -m ...` sweep into one CSV and a summary table.

    python scripts/merge_sweep.py multirun/2026-11-29_10-00-00 [--out DIR]

Writes ``merged.csv`` (every problem of every job, tagged with the job's overrides) and
``merged.md`` (the summary as markdown, for docs) into the sweep dir (or ``--out``), and prints the
summary grouped by task, controller, policy and budget. The logic lives in :mod:`arbor_cli.sweep`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from arbor_cli.sweep import merge, summary_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="the sweep dir (hydra.sweep.dir) holding the job dirs")
    parser.add_argument("--out", type=Path, default=None, help="where to write merged.csv / merged.md")
    args = parser.parse_args(argv)
    try:
        merged = merge(args.sweep_dir, args.out)
    except FileNotFoundError as exc:
        print(f"merge_sweep: error: {exc}", file=sys.stderr)
        return 2
    console = Console()
    console.print(summary_table(merged.summary, title=f"sweep {args.sweep_dir}", width=console.width))
    console.print(f"{len(merged.rows)} rows: {merged.csv_path}\nsummary: {merged.md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
