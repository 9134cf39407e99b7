"""Merge run dirs of one config that ran different problems (shards of a slice) into the first.

    python scripts/merge_runs.py TARGET_RUN_DIR SHARD_RUN_DIR [SHARD_RUN_DIR ...]

e.g. a slice run as two halves side by side (``task.start`` / ``task.end``), then merged so that
``policy.budget_reference`` and the benchmarks read one run dir. The logic lives in
:mod:`arbor_cli.merge`; a shard of another config or data file is refused (exit 2, nothing written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arbor_cli.merge import merge_runs
from arbor_cli.resume import ConfigMismatch, RunDirBusy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="the run dir that receives the shards' problems")
    parser.add_argument("shards", type=Path, nargs="+", help="run dirs of the same config, other problems")
    args = parser.parse_args(argv)
    try:
        added = merge_runs(args.target, args.shards)
    except (FileNotFoundError, ConfigMismatch, RunDirBusy) as exc:
        print(f"merge_runs: error: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(added)} problems into {args.target}" + (f" ({added[0]}-{added[-1]})" if added else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
