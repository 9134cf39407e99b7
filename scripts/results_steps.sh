# Sourced by scripts/results_all.sh: `step NAME [DIR ...] -- COMMAND ...` runs one step of `make results`
# unless it is done at this runtime code already (benchmarks/results/steps.py keeps OUT/steps/NAME.json):
# a fresh step starts from empty DIRs, an interrupted one at the same runtime code resumes with them;
# each step's wall seconds are recorded (an interrupted attempt's too) and STEPS lists the steps run or
# kept, for `report_steps` at the end. Needs OUT and PYTHON.
# ONLY=NAME[,NAME ...] makes a sitting run just those steps (a NAME also selects NAME-*: ONLY=kvp runs
# kvp-collect, kvp-train-* and kvp-data); the rest wait for another sitting and no total is reported.
# `check_only SCRIPT ARGS` refuses, before any step runs, a NAME that selects none of SCRIPT's steps: it
# runs SCRIPT with LIST_STEPS=1, where `step` prints each name instead of running it.
STEPS=()
_STEP='' _STEP_START=0
_step_tool() { "$PYTHON" -m benchmarks.results.steps "$@"; }
_step_exit() {  # an attempt cut short (a failure or a signal): keep its seconds for the total
  [ -z "$_STEP" ] || _step_tool interrupted "$OUT" "$_STEP" $((SECONDS - _STEP_START)) || true
}
trap _step_exit EXIT
trap 'exit 130' INT TERM

# true when ONLY is unset or selects step NAME (one of its names, or NAME-...)
step_selected() {
  local want
  [ -n "${ONLY:-}" ] || return 0
  for want in ${ONLY//,/ }; do
    if [[ $1 == "$want" || $1 == "$want"-* ]]; then return 0; fi
  done
  return 1
}

# true when this sitting runs steps (not LIST_STEPS) and ONLY selects one of GROUP's (named GROUP-...):
# for the work a group's steps share outside them
group_runs() {
  local want
  [ -z "${LIST_STEPS:-}" ] || return 1
  step_selected "$1" && return 0  # ONLY unset, or it names GROUP or a group GROUP is part of
  for want in ${ONLY//,/ }; do
    if [[ $want == "$1"-* ]]; then return 0; fi  # or one of GROUP's steps
  done
  return 1
}

check_only() {  # SCRIPT ARGS...: exit 2 naming each word of ONLY that selects none of SCRIPT's steps
  [ -n "${ONLY:-}" ] && [ -z "${LIST_STEPS:-}" ] || return 0
  local names want unknown=()
  names=$(LIST_STEPS=1 bash "$@" | sed -n 's/^step: //p')
  for want in ${ONLY//,/ }; do
    grep -qxE -- "$want(-.*)?" <<<"$names" || unknown+=("$want")
  done
  [ ${#unknown[@]} = 0 ] && return 0
  echo "results_all.sh: error: ONLY=$ONLY: no step named ${unknown[*]} (or NAME-...); the steps:" $names >&2
  exit 2
}

step() {
  local name=$1 dirs=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do dirs+=("$1"); shift; done
  [ "${1:-}" = -- ] || { echo "results_all.sh: step $name: no -- before its command" >&2; exit 2; }
  shift
  if [ -n "${LIST_STEPS:-}" ]; then echo "step: $name"; return 0; fi
  step_selected "$name" || return 0
  STEPS+=("$name")
  if _step_tool done "$OUT" "$name"; then return 0; fi
  _step_tool begin "$OUT" "$name" "${dirs[@]}"
  _STEP=$name _STEP_START=$SECONDS
  echo "== $name: $*"
  "$@"
  _step_tool end "$OUT" "$name" $((SECONDS - _STEP_START))
  echo "== $name: $((SECONDS - _STEP_START)) s"
  _STEP=''
}

report_steps() {  # SIZE: docs/data/make-results/results.json from the steps' records (every one done)
  [ -z "${LIST_STEPS:-}" ] || return 0
  if [ -n "${ONLY:-}" ]; then
    echo "== ONLY=$ONLY: ${#STEPS[@]} step(s) (${STEPS[*]:-none}); the wall-time total needs a sitting without ONLY"
    return 0
  fi
  _step_tool report "$OUT" "$1" "${STEPS[@]}"
}
