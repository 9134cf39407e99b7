"""Return to a compressed branch under lychee over arbor: made whole first, or its evicted chunks
back on demand in the order decode retrieval wants them (vs position order, vs nothing back).

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_rehydrate.py --threads 1 --data-dir ../shared/data \
        --problems 4 --out bench/rehydrate

Prints the table; rows go to rehydrate.jsonl (appended per tree and configuration: a rerun
resumes) and rehydrate.csv under --out.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.rehydrate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
