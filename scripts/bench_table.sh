#!/usr/bin/env bash
# End-to-end table (issue 5, Table 1 analog) and fixed-memory scaling, as Hydra sweeps on SmolLM2.
#   bash scripts/bench_table.sh [OUT_DIR] [DATA_DIR]
# Each step is a sweep (-m) merged by scripts/merge_sweep.py into merged.csv / merged.md.
set -euo pipefail
OUT=${1:-bench}
DATA=${2:-../shared/data}
BIN=${BIN:-.venv/bin}
SOLVE="$BIN/arbor-solve"
MERGE="$BIN/python scripts/merge_sweep.py"
G24="task=game24 task.data_dir=$DATA task.start=900 task.end=904 controller=best_first controller.n_generate=3 controller.max_expansions=10"
GSM="task=gsm8k task.data_dir=$DATA task.start=0 task.end=2 task.max_steps=4 controller=best_first controller.n_generate=3 controller.max_expansions=5"

for name in game24 gsm8k; do
  args=$([ $name = game24 ] && echo "$G24" || echo "$GSM")
  # 1. full without a budget: the reference peak of every problem
  $SOLVE -m $args policy=full hydra.sweep.dir=$OUT/$name-full
  ref=$(dirname "$(find "$OUT/$name-full" -name results.jsonl | head -1)")
  # 2. every policy at fractions of that peak
  $SOLVE -m $args policy=full,h2o,streaming,thinkv,arbor policy.budget_ratio=0.5,0.75 \
    policy.budget_reference=$ref hydra.sweep.dir=$OUT/$name-budget
  $MERGE $OUT/$name-full
  $MERGE $OUT/$name-budget
done

# 3. fixed-memory scaling: one budget, growing BFS width; which widths complete without OOM
$SOLVE -m task=game24 task.data_dir=$DATA task.start=900 task.end=903 controller=bfs controller.n_generate=2 \
  controller.release_pruned=false controller.breadth=1,2,4,6 policy=full,h2o,arbor policy.budget_tokens=900 \
  hydra.sweep.dir=$OUT/scaling
$MERGE $OUT/scaling
