#!/usr/bin/env bash
# End-to-end table (issue 5, Table 1 analog) and fixed-memory scaling, as Hydra sweeps on SmolLM2.
#   bash scripts/bench_table.sh [OUT_DIR] [DATA_DIR]
# The settings are the experiments conf/experiment/{e2e_game24,e2e_gsm8k,scaling}.yaml; each step is a
# sweep (-m) merged by scripts/merge_sweep.py into merged.csv / merged.md.
set -euo pipefail
OUT=${1:-bench}
DATA=${2:-../shared/data}
BIN=${BIN:-.venv/bin}
SOLVE="$BIN/arbor-solve"
MERGE="$BIN/python scripts/merge_sweep.py"
RATIOS=${RATIOS:-0.6,0.8}

for name in game24 gsm8k; do
  # 1. full without a budget: the reference peak of every problem
  $SOLVE -m experiment=e2e_$name paths.data_dir=$DATA policy=full hydra.sweep.dir=$OUT/$name-full
  ref=$(dirname "$(find "$OUT/$name-full" -name results.jsonl | head -1)")
  # 2. every policy at fractions of that peak
  $SOLVE -m experiment=e2e_$name paths.data_dir=$DATA policy=full,h2o,streaming,thinkv,arbor \
    policy.budget_ratio=$RATIOS "policy.budget_reference='$ref'" hydra.sweep.dir=$OUT/$name-budget
  $MERGE $OUT/$name-full
  $MERGE $OUT/$name-budget
done

# 3. fixed-memory scaling: one budget, growing BFS width (pruned branches kept); which widths complete
$SOLVE -m experiment=scaling paths.data_dir=$DATA hydra.sweep.dir=$OUT/scaling
$MERGE $OUT/scaling
