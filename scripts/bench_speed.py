"""Speed vs naive Tree-of-Thought: each trace's tree built by the runtime, naively, with a prefix cache.

    python scripts/bench_speed.py traces/game24-900.json --repeats 5 --out results/speed.json

Prints prefill tokens, median wall times and the runtime's ratios to each baseline, plus the
runtime's overhead outside model forwards; writes the same as JSON.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.cli import speed_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(speed_main())
