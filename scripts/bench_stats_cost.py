"""Attention statistics' cost per token: prefill and decode under h2o / snapkv vs full, same run.

python scripts/bench_stats_cost.py --out bench/linear/stats_cost.json --threads 2
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.stats_cost import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
