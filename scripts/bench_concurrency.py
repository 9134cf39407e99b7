"""Problems/hour at concurrency 1, 2, 4, 8 (and naive ToT) on the same problems.

    python scripts/bench_concurrency.py --levels 1,2,4,8 --naive \
        --policies "policy=full;policy=arbor policy.budget_tokens=1500" \
        --out bench/concurrency/game24 model=smollm2 task=game24 task.start=900 task.end=908
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.concurrency import concurrency_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(concurrency_main())
