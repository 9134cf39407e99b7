"""Attention statistics' cost per token: prefill and decode under h2o / snapkv vs full, same run.

python scripts/bench_stats_cost.py --out bench/linear/stats_cost.json --threads 2
"""

import sys

from arbor_cli.bench.stats_cost import main

if __name__ == "__main__":
    sys.exit(main())
