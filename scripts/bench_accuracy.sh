#!/usr/bin/env bash
# Game of 24 accuracy (the ToT test slice): IO, CoT-style single sample, ToT BFS with sampled and with
# legal-move proposals, each under `full` and under arbor / h2o / streaming at fractions of full's peak
# (per problem); plus the exact-solver oracle as one labeled upper-bound row. Model-based values only
# (settings: conf/experiment/acc/*.yaml).
#   bash scripts/bench_accuracy.sh [OUT_DIR] [DATA_DIR] [START] [END]
# Then it writes docs/data/accuracy/results.json (DATA_ROOT= elsewhere); `make results-page` renders it.
set -euo pipefail
OUT=${1:-bench/accuracy}
DATA=${2:-../shared/data}
START=${3:-900}
END=${4:-1000}
SOLVE=${BIN:-.venv/bin}/arbor-solve
MODES=${MODES:-io cot tot_sample tot_legal}
RATIOS=${RATIOS:-0.5 0.25}
POLICIES=${POLICIES:-arbor h2o streaming}
COMMON="paths.data_dir=$DATA task.start=$START task.end=$END save_trees=false"

for mode in $MODES; do
  # full without a budget: the reference peak of every problem
  $SOLVE experiment=acc/$mode $COMMON policy=full run_dir=$OUT/$mode/full
  for policy in $POLICIES; do
    for ratio in $RATIOS; do
      $SOLVE experiment=acc/$mode $COMMON policy=$policy policy.budget_ratio=$ratio \
        "policy.budget_reference='$OUT/$mode/full'" run_dir=$OUT/$mode/$policy-$ratio
    done
  done
done
# the oracle: ToT BFS with legal moves steered by the exact solver (an upper bound, labeled as such)
$SOLVE experiment=acc/tot_legal verifier=game24_oracle $COMMON policy=full run_dir=$OUT/oracle/full
# the section's data (docs/data/accuracy/results.json, or under $DATA_ROOT), with this command and commit
PYTHON=${PYTHON:-${BIN:-.venv/bin}/python}
$PYTHON -m benchmarks.results.accuracy "$OUT" ${DATA_ROOT:+--data-root "$DATA_ROOT"} \
  --command "MODES='$MODES' POLICIES='$POLICIES' RATIOS='$RATIOS' bash scripts/bench_accuracy.sh $OUT $DATA $START $END"
