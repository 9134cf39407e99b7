"""Trace-replay fidelity of arbor with and without KVP choosing its tokens inside blocks.

    python scripts/record_trace.py --out bench/kvp/traces experiment=e2e_gsm8k paths.data_dir=../shared/data \
        task.end=1
    python scripts/bench_kvp_replay.py bench/kvp/traces/*.json --out bench/kvp/replay.jsonl --threads 2
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ is beside the package, not in it

from research.kvp.cli import replay_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(replay_main())
