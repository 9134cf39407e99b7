"""Long-context fidelity on a RULER-style synthetic suite: dense vs lychee / quest (read budgets) and
kvp / h2o / snapkv / streaming (kept shares), per task and length.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_longctx.py --threads 1 --lengths 2048,4096,8192 \
        --items 20 --shares 0.5,0.25,0.1 --out bench/longctx/longctx.json

Per task, length and method: accuracy, answer agreement with dense, first-token agreement, KL of
the first answer token, decode tokens/s. The protocol is in benchmarks/longctx/run.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.longctx.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
