"""Per-step cost of grammar-constrained sampling: the same expansion with and without a grammar.

    python scripts/bench_grammar.py --model smollm2 --rows 4 --tokens 16 --repeats 3 --out bench/grammar.json

Two measurements on one model, in one process:
- an expansion of ``rows`` x ``tokens`` under a grammar that admits every token (so both runs sample
  exactly the same tokens) against the same expansion unconstrained: wall time per decode step;
- the time spent computing and applying the masks (llguidance's mask, unpacking it, masking the
  logits) per row and step, for that grammar and for the Game of 24 step regex.
Writes one JSON object (medians over ``repeats``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP (see arbor_cli/__init__.py)

import arbor_runtime.generation as generation  # noqa: E402
from arbor_runtime import Runtime, SamplingParams, load_model  # noqa: E402

PROMPT = "Use numbers and basic arithmetic operations (+ - * /) to obtain 24.\nInput: 4 5 6 10\nSteps:\n"
STEP_REGEX = r"(10|4|5|6) [-+*/] (10|4|5|6) = -?[0-9]{1,4}(/[0-9]{1,4})? \(left"


def timed_expand(rt: Runtime, params: SamplingParams, rows: int) -> tuple[float, float, int]:
    """(wall seconds, seconds inside mask_logits, decode steps) of one expansion of a fresh tree."""
    spent = [0.0]
    inner = generation.mask_logits

    def counting(logits, matchers):
        start = time.perf_counter()
        out = inner(logits, matchers)
        spent[0] += time.perf_counter() - start
        return out

    generation.mask_logits = counting
    try:
        root = rt.new_tree(PROMPT)
        start = time.perf_counter()
        kids = rt.expand(root, rows, params)
        wall = time.perf_counter() - start
        rt.release(root)
    finally:
        generation.mask_logits = inner
    return wall, spent[0], max(k.length for k in kids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/grammar.json")
    args = ap.parse_args()
    loaded = load_model(args.model)
    rt = Runtime(loaded, seed=0)
    vocab = int(loaded.model.config.vocab_size)
    base = dict(max_new_tokens=args.tokens, temperature=1.0, seed=1, stop_at_eos=False)
    runs = {
        "unconstrained": SamplingParams(**base),
        "grammar_all_tokens": SamplingParams(**base, grammar=f"start: <[0-{vocab - 1}]>*"),
        "game24_step_regex": SamplingParams(**base, regex=STEP_REGEX),
    }
    timed_expand(rt, runs["grammar_all_tokens"], args.rows)  # warm-up: the tokenizer view, first compile
    out: dict = {"model": args.model, "rows": args.rows, "tokens": args.tokens, "repeats": args.repeats}
    for name, params in runs.items():
        samples = [timed_expand(rt, params, args.rows) for _ in range(args.repeats)]
        wall, mask, steps = (statistics.median(s[i] for s in samples) for i in range(3))
        out[name] = {
            "steps": steps,
            "ms_per_step": 1000 * wall / steps,
            "mask_ms_per_step": 1000 * mask / steps,
            "mask_ms_per_row_step": 1000 * mask / (steps * args.rows),
        }
    free, full = out["unconstrained"]["ms_per_step"], out["grammar_all_tokens"]["ms_per_step"]
    out["step_time_ratio_constrained_over_free"] = full / free
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
