#!/usr/bin/env bash
# Each controller on 2 Game of 24 puzzles and 2 GSM8K questions (SmolLM2), small search sizes.
#   bash scripts/bench_controllers.sh [OUT_DIR] [DATA_DIR]
set -u
OUT=${1:-bench/ctrl}
DATA=${2:-../shared/data}
SOLVE=${BIN:-.venv/bin}/arbor-solve
for c in bfs beam dfs best_first mcts; do
  case $c in
    bfs) X="controller.n_generate=3 controller.breadth=2";;
    beam) X="controller.beam_width=2 controller.samples_per_node=3";;
    dfs) X="controller.n_generate=3 controller.max_visits=8";;
    best_first) X="controller.n_generate=3 controller.max_expansions=8";;
    mcts) X="controller.n_generate=3 controller.iterations=8";;
  esac
  $SOLVE task=game24 task.data_dir=$DATA task.start=900 task.end=902 controller=$c $X run_dir=$OUT/game24-$c
  $SOLVE task=gsm8k task.data_dir=$DATA task.start=0 task.end=2 task.max_steps=4 controller=$c $X run_dir=$OUT/gsm8k-$c
done
