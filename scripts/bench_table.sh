#!/usr/bin/env bash
# End-to-end table (issue 5, Table 1 analog) and fixed-memory scaling, as Hydra sweeps on SmolLM2.
#   bash scripts/bench_table.sh [OUT_DIR] [DATA_DIR]
# Each step is a sweep (-m) merged by scripts/merge_sweep.py into merged.csv / merged.md.
# Game of 24 uses the 1-shot prompt and BFS that keeps pruned branches, GSM8K best-first search:
# with the 5-shot prompt the prompt alone is most of the KV and no budget fraction would matter.
set -euo pipefail
OUT=${1:-bench}
DATA=${2:-../shared/data}
BIN=${BIN:-.venv/bin}
SOLVE="$BIN/arbor-solve"
MERGE="$BIN/python scripts/merge_sweep.py"
RATIOS=${RATIOS:-0.6,0.8}
G24="task=game24 task.data_dir=$DATA task.start=900 task.end=904 task.n_shots=1 controller=bfs controller.n_generate=4 controller.breadth=2 controller.release_pruned=false"
GSM="task=gsm8k task.data_dir=$DATA task.start=0 task.end=2 task.max_steps=4 task.max_thought_tokens=40 controller=best_first controller.n_generate=3 controller.max_expansions=6"

for name in game24 gsm8k; do
  args=$([ $name = game24 ] && echo "$G24" || echo "$GSM")
  # 1. full without a budget: the reference peak of every problem
  $SOLVE -m $args policy=full hydra.sweep.dir=$OUT/$name-full
  ref=$(dirname "$(find "$OUT/$name-full" -name results.jsonl | head -1)")
  # 2. every policy at fractions of that peak
  $SOLVE -m $args policy=full,h2o,streaming,thinkv,arbor policy.budget_ratio=$RATIOS \
    "policy.budget_reference='$ref'" hydra.sweep.dir=$OUT/$name-budget
  $MERGE $OUT/$name-full
  $MERGE $OUT/$name-budget
done

# 3. fixed-memory scaling: one budget, growing BFS width (pruned branches kept); which widths complete
$SOLVE -m task=gsm8k task.data_dir=$DATA task.start=0 task.end=2 task.max_steps=4 task.max_thought_tokens=40 \
  controller=bfs controller.n_generate=2 controller.release_pruned=false controller.breadth=1,2,4,8 \
  policy=full,h2o,arbor policy.budget_tokens=700 hydra.sweep.dir=$OUT/scaling
$MERGE $OUT/scaling
