"""Decode time per step at both retention granularities (issue 66, item 4d): does keeping tokens per
(layer, KV head) cost the decode anything?

For each policy, one held-out few-shot context (``benchmarks.linear``'s) is prefilled under a budget of
``--share`` of it (the user's path: the budget set from the start, the prompt compressed while it
grows), then one row decodes ``--steps`` greedy tokens under the same budget, so the policy plans on
every step. Each repetition runs ``granularity=token`` and ``granularity=head`` back to back (their
order alternating), and the ratio head / token is taken per repetition: the machine's drift between
repetitions cancels in the pair. The table gives the median ms per decode step of each and the
median ratio with its min-max over the repetitions.

    python -m benchmarks.per_head_step --data-dir ../shared/data [--policies random,kvp,h2o,snapkv,streaming]
        [--context gsm8k:6:0] [--share 0.5] [--steps 32] [--reps 5] [--out bench/per-head-step.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from arbor_runtime import Runtime, SamplingParams, build_policy, load_model
from arbor_runtime.policies.scorer import PER_HEAD_POLICIES
from benchmarks.linear import build_context

GRANULARITIES = ("token", "head")


def decode_ms(loaded, context_ids: list[int], policy: str, granularity: str, budget: int, steps: int) -> float:
    """ms per decode step of one greedy row of ``steps`` tokens after ``context_ids``, under ``budget``."""
    rt = Runtime(loaded, build_policy(policy, budget_tokens=budget, granularity=granularity))
    root = rt.new_tree_ids(context_ids)
    params = SamplingParams(max_new_tokens=steps, temperature=0.0, stop_at_eos=False)
    start = time.perf_counter()
    rt.expand(root, 1, params)
    seconds = time.perf_counter() - start
    if rt.metrics.peak_device_tokens > budget:
        raise RuntimeError(f"{policy} {granularity}: {rt.metrics.peak_device_tokens} device tokens over {budget}")
    return 1000 * seconds / steps


def measure(loaded, context_ids: list[int], policies: list[str], share: float, steps: int, reps: int) -> list[dict]:
    """Per policy: the paired ms per step of each granularity over ``reps`` repetitions."""
    budget = max(16, int(len(context_ids) * share))
    rows = []
    for policy in policies:
        runs = {g: [] for g in GRANULARITIES}
        for rep in range(reps):
            for g in GRANULARITIES if rep % 2 == 0 else reversed(GRANULARITIES):
                runs[g].append(decode_ms(loaded, context_ids, policy, g, budget, steps))
        ratios = [h / t for h, t in zip(runs["head"], runs["token"], strict=True)]
        rows.append(
            {
                "policy": policy,
                "budget_tokens": budget,
                "token_ms": statistics.median(runs["token"]),
                "head_ms": statistics.median(runs["head"]),
                "ratio": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "runs": runs,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--policies", default="random,kvp,streaming,h2o,snapkv,thinkv")
    ap.add_argument("--context", default="gsm8k:6:0", help="TASK:SHOTS:QUESTION (benchmarks.linear)")
    ap.add_argument("--share", type=float, default=0.5, help="the budget as a share of the context")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/per-head-step.json")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in PER_HEAD_POLICIES]
    if bad or not 0 < args.share < 1 or args.steps < 1 or args.reps < 1:
        ap.error(
            f"--policies {bad} (valid: {', '.join(PER_HEAD_POLICIES)}), --share {args.share} in (0, 1), "
            f"--steps {args.steps} and --reps {args.reps} >= 1"
        )
    if not (Path(args.data_dir) / "gsm8k").is_dir():
        ap.error(f"--data-dir {args.data_dir}: no gsm8k/ folder there")
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2", device="cpu")
    ctx = build_context(loaded.tokenizer, Path(args.data_dir), args.context)
    start = time.perf_counter()
    rows = measure(loaded, ctx.context_ids, policies, args.share, args.steps, args.reps)
    table = Table(title=f"decode ms per step, {args.context} ({len(ctx.context_ids)} tokens), budget {args.share:.0%}")
    for col in ("policy", "token ms", "head ms", "head / token (median, min-max)"):
        table.add_column(col)
    for r in rows:
        ratio = f"{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})"
        table.add_row(r["policy"], f"{r['token_ms']:.1f}", f"{r['head_ms']:.1f}", ratio)
    Console().print(table)
    out = {
        "command": "python -m benchmarks.per_head_step " + " ".join(sys.argv[1:] if argv is None else argv),
        "context": args.context,
        "context_tokens": len(ctx.context_ids),
        "share": args.share,
        "steps": args.steps,
        "reps": args.reps,
        "threads": args.threads,
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
