"""Record full searches as JSON traces (one file per problem) for replay and speed benchmarks.

    python scripts/record_trace.py --out traces model=smollm2 task=game24 task.start=900 task.end=903
    python scripts/record_trace.py --out traces model=tiny-random paths.data_dir=../shared/data task.end=901

Overrides are arbor-solve's (task=, controller=, model=, verifier=, seed=); the policy is always
``full`` without a budget.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.cli import record_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(record_main())
