"""What arbor costs next to full (issue 46): time ratios at no budget, 1x, 0.5x, 0.25x and the floor, or a profile.

    python scripts/bench_overhead.py --repeats 3 --out bench/overhead/game24 experiment=table1_game24 task.end=904
    python scripts/bench_overhead.py --profile --out bench/overhead/profile-game24 experiment=table1_game24 task.end=901
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.overhead import overhead_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(overhead_main())
