"""kvp vs h2o / snapkv / streaming on held-out few-shot contexts (the protocol of bench_linear.py).

    python scripts/bench_kvp.py --out bench/kvp/bench.json --threads 2 --shares 0.1,0.2,0.5
    python scripts/bench_kvp.py --protocol budget --threads 2 --shares 0.1,0.25,0.5  # bench/kvp/bench-budget.json

Per kept share: retained future attention (the share of the uncompressed model's question and
continuation attention to the context that falls on the kept tokens; the oracle is the ceiling),
KL(full || compressed) and top-1 over the teacher-forced continuation; and kvp's scoring cost per
decode step. Contexts use GSM8K train rows 0-9 as shots (never in KVP training) and test questions.
``--protocol budget`` runs the user's path instead (``arbor-solve policy.budget_tokens=B``): the budget
(the kept share of the context) is set from the start, the context is prefilled in chunks and
compressed while it grows, and question + continuation are teacher-forced under the same budget.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ is beside the package, not in it

from research.kvp.cli import bench_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(bench_main())
