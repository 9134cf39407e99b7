"""Collect KVP training data: context K/V and the future attention per layer and KV head.

    python scripts/kvp_collect.py --out bench/kvp/data --sequences 200 --threads 2

Texts are few-shot GSM8K *train* contexts (rows 100+) and Game of 24 searches outside the test
slice 900-999, each followed by one more worked example whose queries give the target attention.
Shards are safetensors (float16 K/V, float32 attention) under a disk cap (--max-gb).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ is beside the package, not in it

from research.kvp.cli import collect_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(collect_main())
