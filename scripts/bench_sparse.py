"""Sparse decode attention (policy=lychee, policy=quest) vs dense, by context length.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_sparse.py --threads 1 --data-dir ../shared/data \
        --contexts 2048,4096,8192 --random-contexts 16384,32768 --out bench/sparse

SmolLM2 at 2K/4K/8K (few-shot GSM8K / MATH-500 contexts): decode tokens/s, attention ms per step
(index and sparse attention apart, index build once), top-1 agreement and KL vs dense; a
random-weight model of SmolLM2's shape at 16K/32K (synthetic K/V): speed only. Writes
sparse.jsonl and sparse.csv under --out and prints the table.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.sparse_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
