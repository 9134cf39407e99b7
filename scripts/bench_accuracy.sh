#!/usr/bin/env bash
# Game of 24 accuracy (the ToT test slice): IO, CoT-style single sample, ToT BFS with sampled and with
# legal-move proposals, each under `full` and under arbor / h2o / streaming at fractions of full's peak
# (per problem); plus the exact-solver oracle as one labeled upper-bound row. Model-based values only
# (settings: conf/experiment/acc/*.yaml).
#   bash scripts/bench_accuracy.sh [OUT_DIR] [DATA_DIR] [START] [END]
# Then it writes docs/data/accuracy/results.json (DATA_ROOT= elsewhere); `make results-page` renders it.
# Every run resumes in its run dir (rerun the same command after an interruption). JOBS=N runs N arbor-solve
# side by side, each with one torch thread (OMP_NUM_THREADS=1 unless set): first every mode's `full` run and
# the oracle, then the budgeted runs, longest (ToT) first; the same runs with the same settings, in about
# 1/N of the time on an N-core machine. JOBS=1 (the default) runs them one after the other.
set -euo pipefail
OUT=${1:-bench/accuracy}
DATA=${2:-../shared/data}
START=${3:-900}
END=${4:-1000}
SOLVE=${BIN:-.venv/bin}/arbor-solve
MODES=${MODES:-io cot tot_sample tot_legal}
RATIOS=${RATIOS:-0.5 0.25}
POLICIES=${POLICIES:-arbor h2o streaming}
JOBS=${JOBS:-1}
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
  echo "bench_accuracy.sh: error: JOBS=$JOBS: expected a whole number >= 1 (runs side by side)" >&2
  exit 2
fi
[ "$JOBS" = 1 ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
COMMON="paths.data_dir=$DATA task.start=$START task.end=$END save_trees=false"

# one run, named MODE:full, oracle, or MODE:POLICY:RATIO (the budget set from MODE's full run, per problem)
run_one() {
  local mode policy ratio
  IFS=: read -r mode policy ratio <<< "$1"
  case $1 in
    oracle)  # ToT BFS with legal moves steered by the exact solver (an upper bound, labeled as such)
      $SOLVE experiment=acc/tot_legal verifier=game24_oracle $COMMON policy=full run_dir="$OUT/oracle/full" ;;
    *:full) $SOLVE experiment="acc/$mode" $COMMON policy=full run_dir="$OUT/$mode/full" ;;
    *) $SOLVE experiment="acc/$mode" $COMMON policy="$policy" policy.budget_ratio="$ratio" \
      "policy.budget_reference='$OUT/$mode/full'" run_dir="$OUT/$mode/$policy-$ratio" ;;
  esac
}
export -f run_one
export OUT COMMON SOLVE

run_all() {  # RUN ...: JOBS at a time, each taking the next when it finishes; fails when any run failed
  if [ "$JOBS" = 1 ]; then
    local r
    for r in "$@"; do run_one "$r"; done
  else
    printf '%s\n' "$@" | xargs -P "$JOBS" -I{} bash -c 'run_one "$1"' _ {}
  fi
}

fulls=() budgeted=()
for mode in $MODES; do fulls+=("$mode:full"); done
fulls+=(oracle)
for mode in $(printf '%s\n' $MODES | sort -r); do  # tot_* before io and cot: the longest runs first
  for policy in $POLICIES; do
    for ratio in $RATIOS; do budgeted+=("$mode:$policy:$ratio"); done
  done
done
# full without a budget first: the reference peak of every problem
run_all "${fulls[@]}"
run_all "${budgeted[@]}"
# the section's data (docs/data/accuracy/results.json, or under $DATA_ROOT), with this command and commit
PYTHON=${PYTHON:-${BIN:-.venv/bin}/python}
given="MODES='$MODES' POLICIES='$POLICIES' RATIOS='$RATIOS'"
[ "$JOBS" = 1 ] || given="$given JOBS=$JOBS"
$PYTHON -m benchmarks.results.accuracy "$OUT" ${DATA_ROOT:+--data-root "$DATA_ROOT"} \
  --command "$given bash scripts/bench_accuracy.sh $OUT $DATA $START $END"
