"""Rebuild docs/results.md and README's headline table from docs/data alone (`make results-page`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results.page import write  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="docs/results.md")
    ap.add_argument("--readme", default="README.md", help="README to splice the headline table into ('' = none)")
    ap.add_argument("--data", default=None, help="the data folder (default: docs/data)")
    ap.add_argument("--plots", action="store_true", help="only redraw the PNGs drawn from docs/data (matplotlib)")
    args = ap.parse_args()
    if args.plots:
        from benchmarks.results.page import load_all
        from benchmarks.results.plots import draw_all

        root = {"root": Path(args.data)} if args.data else {}
        for path in draw_all(load_all(**root), Path(args.out).parent):
            print(f"wrote {path}")
        return
    kwargs = {"root": Path(args.data)} if args.data else {}
    write(Path(args.out), Path(args.readme) if args.readme else None, **kwargs)
    print(f"wrote {args.out}" + (f" and {args.readme}'s results block" if args.readme else ""))


if __name__ == "__main__":
    main()
