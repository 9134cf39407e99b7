"""The project's linear policies side by side with kvpress's presses, on the same token ids.

    python scripts/bench_linear.py --out bench/linear/linear.json --threads 2 \
        --kvpress-venv /tmp/kvpress-venv --create-venv

Each few-shot context (GSM8K / MATH500, 600-2000 SmolLM2 tokens) is prefilled whole, compressed
once to each kept share (50/25/10%), then question + the uncompressed model's greedy continuation
are teacher-forced; per continuation step, KL(full || compressed) and top-1 agreement. The
project side runs in this venv (``Runtime.compress``); kvpress 0.5.5 (it pins transformers < 5.3)
runs in its own venv, created with ``--create-venv`` (torch pinned to 2.13.0 there too), loading
the same converted SmolLM2 weights. Every kvpress press runs as shipped (per layer and KV head)
and with its scores averaged over heads and layers (whole tokens, like this runtime).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.linear_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
