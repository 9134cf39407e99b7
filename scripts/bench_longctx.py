"""Long-context fidelity on a RULER-style synthetic suite: dense vs lychee / quest (read budgets) and
kvp / h2o / snapkv / streaming (kept shares), per task and length.

    OMP_NUM_THREADS=1 python scripts/bench_longctx.py --threads 1 --lengths 2048,4096,8160 \
        --items 20 --shares 0.5,0.25,0.1,default --out bench/longctx/ruler_summary.json \
        --rows bench/longctx/ruler_rows.jsonl

(8160, not 8192: the prompt plus 24 answer tokens must fit SmolLM2's 8,192 positions; "default": lychee
and quest at their own read rule.) --first K runs items K..--items-1 only: runs over other lengths or
index ranges in parallel, each with its own --rows, are joined with --summary-only --runs-from
(docs/data/longctx/README.md has the commands the committed suite was made with). Per task,
length and method: accuracy, answer agreement with dense, first-token agreement (each with a 95%
Wilson interval), KL of the first answer token, decode tokens/s. Rows are appended to --rows after
every item and a run resumes from them (items whose rows are all there are skipped); --redo
lychee,quest drops those policies' rows first and measures them again; --summary-only rebuilds
--out from --rows. benchmarks/longctx/report.py renders the summary as markdown. The protocol is
in benchmarks/longctx/run.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is beside the package, not in it

from benchmarks.longctx.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
