# Sourced by scripts/results_all.sh: `step NAME [DIR ...] -- COMMAND ...` runs one step of `make results`
# unless it is done at this runtime code already (benchmarks/results/steps.py keeps OUT/steps/NAME.json):
# a fresh step starts from empty DIRs, an interrupted one at the same runtime code resumes with them;
# each step's wall seconds are recorded (an interrupted attempt's too) and STEPS lists the steps run or
# kept, for `report_steps` at the end. Needs OUT and PYTHON.
STEPS=()
_STEP='' _STEP_START=0
_step_tool() { "$PYTHON" -m benchmarks.results.steps "$@"; }
_step_exit() {  # an attempt cut short (a failure or a signal): keep its seconds for the total
  [ -z "$_STEP" ] || _step_tool interrupted "$OUT" "$_STEP" $((SECONDS - _STEP_START)) || true
}
trap _step_exit EXIT
trap 'exit 130' INT TERM

step() {
  local name=$1 dirs=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do dirs+=("$1"); shift; done
  [ "${1:-}" = -- ] || { echo "results_all.sh: step $name: no -- before its command" >&2; exit 2; }
  shift
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
  _step_tool report "$OUT" "$1" "${STEPS[@]}"
}
