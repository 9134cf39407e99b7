"""Live searches at shrinking budgets (arbor-solve overrides), each compared with full's tree.

    python scripts/bench_budgets.py --policies arbor,h2o --fractions 0.75,0.5,0.35,0.25 \
        --out bench/budgets/game24 model=smollm2 task=game24 task.start=900 task.end=902 \
        controller=bfs controller.n_generate=5 controller.breadth=5 controller.release_pruned=false
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.budgets import budgets_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(budgets_main())
