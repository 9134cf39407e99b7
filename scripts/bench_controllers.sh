#!/usr/bin/env bash
# Each controller on 2 Game of 24 puzzles and 2 GSM8K questions (SmolLM2), small searches.
#   bash scripts/bench_controllers.sh [OUT_DIR] [DATA_DIR]
# Search sizes per controller: conf/experiment/ctrl/<controller>.yaml.
set -u
OUT=${1:-bench/ctrl}
DATA=${2:-../shared/data}
SOLVE=${BIN:-.venv/bin}/arbor-solve
for c in bfs beam dfs best_first mcts; do
  # game24_oracle: the exact solver, as when docs/results.md was measured (rows say "oracle (upper bound)")
  $SOLVE experiment=ctrl/$c paths.data_dir=$DATA task=game24 verifier=game24_oracle task.start=900 task.end=902 \
    run_dir=$OUT/game24-$c
  $SOLVE experiment=ctrl/$c paths.data_dir=$DATA task=gsm8k task.start=0 task.end=2 task.max_steps=4 \
    run_dir=$OUT/gsm8k-$c
done
