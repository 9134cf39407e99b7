"""Speed vs naive Tree-of-Thought: each trace's tree built by the runtime, naively, with a prefix cache.

    python scripts/bench_speed.py traces/game24-900.json --repeats 5 --out results/speed.json

Prints prefill tokens, median wall times and the runtime's ratios to each baseline, plus the
runtime's overhead outside model forwards; writes the same as JSON.
"""

import sys

from arbor_cli.bench.cli import speed_main

if __name__ == "__main__":
    sys.exit(speed_main())
