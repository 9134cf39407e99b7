"""Train KVP scorers (one per layer and KV head) on kvp_collect.py shards; ship the weights.

    python scripts/kvp_train.py --data bench/kvp/data --threads 2 \
        --out arbor_runtime/policies/weights/kvp-smollm2.safetensors

Loss: listwise cross-entropy to each head's future attention (default) or the smooth retained
mass over budgets 10..90% (--loss budgets); both judged by the held-out retained-mass AUC over
budgets 10..90%, next to recency, StreamingLLM, key norm and the oracle (bench/kvp/train.json).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ is beside the package, not in it

from research.kvp.cli import train_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(train_main())
