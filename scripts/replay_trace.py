"""Replay recorded traces teacher-forced under each policy and budget; fidelity vs full.

    python scripts/replay_trace.py traces/game24-900.json --out results/replay
    python scripts/replay_trace.py traces/*.json --policies h2o,arbor --fractions 0.3,0.5 --threads 2

Writes ``<out>/replay.jsonl`` (one row per trace x policy x budget, with the per-step memory
series) and ``<out>/replay.csv`` (scalar columns), and prints a rich table per trace.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.cli import replay_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(replay_main())
