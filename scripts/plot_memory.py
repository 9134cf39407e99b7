"""Resident device KV per search step for each policy on one trace (ArborKV Figure 3 analog).

    python scripts/plot_memory.py traces/game24-900.json --fractions 0.3,0.5 --out results/memory.png
    python scripts/plot_memory.py traces/game24-900.json --budget-tokens 600 --policies full,h2o,arbor

Writes the PNG (one panel per budget) and the plotted series as JSON next to it.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.cli import plot_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(plot_main())
