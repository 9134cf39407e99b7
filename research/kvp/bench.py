"""KVP against the heuristics on held-out text: retained future attention, KL and top-1.

The protocol is ``bench_linear.py``'s (project side): a few-shot context (GSM8K *train* rows 0-9
as shots, which KVP training never sees, and a GSM8K *test* question; or MATH500 test rows) is
prefilled whole, compressed once to a kept share, then question + the uncompressed model's greedy
continuation are teacher-forced; per continuation step KL(full || compressed) and top-1 agreement.
Added here, for each kept token set: the *retained future attention*, the share of the attention
the uncompressed model's question and continuation queries pay to the context that falls on the
kept tokens (per layer and KV head, averaged; the quantity KVP is trained to keep), with the
oracle (the best whole-token set for that quantity) as the ceiling. The scoring cost of kvp per
decode step is measured on the same contexts (:func:`scoring_cost`).

Two protocols (``--protocol``): ``compress`` is the one above (prefill whole, one ``rt.compress``,
then teacher-force with nothing evicted); ``budget`` is the user's path (``arbor-solve
policy.budget_tokens=B``): a runtime whose budget is the kept share of the context from the start
prefills the context through its normal chunked path, compressing while it grows, then teacher-forces
question + continuation under the same budget (:func:`budget_run`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from arbor_runtime import Runtime, SamplingParams, build_policy
from arbor_runtime.loading import LoadedModel
from benchmarks.linear import (
    Context,
    ProjectRun,
    compare,
    kept_of,
    kept_tokens,
    policy_variant,
    prefill,
    project_run,
    reference_continuation,
)
from research.kvp.collect import future_attention

log = logging.getLogger(__name__)
DEFAULT_POLICIES = ("kvp", "h2o", "snapkv", "streaming")
PROTOCOLS = ("compress", "budget")


def context_attention(loaded: LoadedModel, ctx: Context) -> torch.Tensor:
    """(L, H_kv, C) attention the question + continuation queries pay each context token, per head
    normalised to sum 1 over the context (the full, uncompressed model)."""
    ids = ctx.context_ids + ctx.question_ids + ctx.continuation_ids
    att = torch.stack(future_attention(loaded.model, ids, len(ctx.context_ids)).attention)
    return att / att.sum(-1, keepdim=True).clamp_min(1e-12)


def retained(att: torch.Tensor, kept: torch.Tensor) -> float:
    """Share of future attention on the ``kept`` context tokens, averaged over layers and heads.
    ``kept``: (k,) tokens kept in every head, or (L, H_kv, k) each layer's and KV head's own."""
    if kept.dim() == 3:
        return float(att.gather(-1, kept).sum(-1).mean())
    return float(att[..., kept].sum(-1).mean())


def oracle_retained(att: torch.Tensor, count: int, per_head: bool = False) -> float:
    """The most any set of ``count`` tokens can retain: whole tokens (the top tokens by mean share),
    or with ``per_head`` each layer's and KV head's own top ``count``."""
    if per_head:
        return retained(att, att.topk(count, dim=-1).indices)
    return retained(att, att.mean(dim=(0, 1)).topk(count).indices)


def budget_run(loaded: LoadedModel, ctx: Context, policy: str, ratio: float, **kwargs: Any) -> ProjectRun:
    """The user's path at one kept share: ``budget_tokens`` = the kept share of the context from the
    start, the context prefilled through the runtime's chunked path (compressed while it grows), then
    question + continuation teacher-forced under the same budget. ``kept``: the context tokens
    (root block-local indices) still on the device at the end."""
    start = time.perf_counter()
    budget = kept_tokens(len(ctx.context_ids), ratio)
    rt = Runtime(loaded, build_policy(policy, budget_tokens=budget, **kwargs))
    blocks: dict[int, torch.Tensor] = {}
    rt.logits_hook = lambda node, logp: blocks.__setitem__(node.id, logp)
    root = rt.new_tree_ids(ctx.context_ids)
    node = rt.append_ids(root, ctx.question_ids + ctx.continuation_ids)
    kept = kept_of(rt, root.id)
    if rt.metrics.peak_device_tokens > budget:
        raise RuntimeError(f"{policy} used {rt.metrics.peak_device_tokens} device tokens over its budget of {budget}")
    logp = blocks[node.id][len(ctx.question_ids) :].float()
    return ProjectRun(logp, int(kept.numel()), time.perf_counter() - start, kept)


def run_context(
    loaded: LoadedModel,
    ctx: Context,
    policies: list[str],
    ratios: list[float],
    steps: int,
    variants: dict[str, dict[str, Any]] | None = None,
    protocol: str = "compress",
) -> dict[str, Any]:
    """Every policy x ratio on one context: KL / top-1 per step and retained future attention.

    ``variants`` adds kvp runs under other names: name -> KVPPolicy arguments. ``protocol``: ``compress``
    (prefill whole, compress once) or ``budget`` (the budget from the start: :func:`budget_run`).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}; valid: {', '.join(PROTOCOLS)}")
    base = prefill(loaded, ctx, "full")
    reference_continuation(base, ctx, steps)
    full = project_run(base, ctx, None)
    att = context_attention(loaded, ctx)
    per_head = any(name.endswith("@head") for name in [*policies, *(variants or {})])
    runs = [
        {
            "policy": name,
            "compression_ratio": r,
            "retained": oracle_retained(att, kept_tokens(len(ctx.context_ids), r), per_head=name.endswith("@head")),
        }
        for r in ratios
        for name in (("oracle", "oracle@head") if per_head else ("oracle",))
    ]
    named = {p: policy_variant(p) for p in policies} | {n: ("kvp", kw) for n, kw in (variants or {}).items()}
    for policy, (kind, kwargs) in named.items():
        pre = prefill(loaded, ctx, kind, **kwargs) if protocol == "compress" else None
        for ratio in ratios:
            run = project_run(pre, ctx, ratio) if pre is not None else budget_run(loaded, ctx, kind, ratio, **kwargs)
            kl, top1 = compare(full.logp, run.logp)
            seconds = {"prefill_seconds": pre.seconds} if pre is not None else {"seconds": run.seconds}
            runs.append(
                {"policy": policy, "compression_ratio": ratio, "kept_tokens": run.kept_tokens, "kl": kl,
                 "top1": top1, "retained": retained(att, run.kept)} | seconds
            )  # fmt: skip
            log.info(
                "%s %s %.2f: KL %.4f retained %.3f", ctx.name, policy, ratio, sum(kl) / len(kl), runs[-1]["retained"]
            )
    return {"name": ctx.name, "context_tokens": len(ctx.context_ids), "protocol": protocol, "runs": runs}


def summarize(contexts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (policy, kept share): mean KL and top-1 over every step of every context, mean
    retained future attention over contexts."""
    cells: dict[tuple[str, float], list[dict]] = {}
    for c in contexts:
        for r in c["runs"]:
            cells.setdefault((r["policy"], r["compression_ratio"]), []).append(r)
    rows = []
    for (policy, ratio), runs in cells.items():
        row = {
            "policy": policy,
            "kept_share": round(1 - ratio, 6),
            "retained": sum(r["retained"] for r in runs) / len(runs),
        }
        if "kl" in runs[0]:
            kl = [x for r in runs for x in r["kl"]]
            top1 = [float(x) for r in runs for x in r["top1"]]
            row |= {"mean_kl": sum(kl) / len(kl), "top1": sum(top1) / len(top1)}
        rows.append(row)
    return sorted(rows, key=lambda r: (r["kept_share"], r["policy"]))


def scoring_cost(loaded: LoadedModel, ctx: Context, budget_share: float = 0.5, steps: int = 24) -> dict[str, float]:
    """kvp's scoring cost per decode step at a budget of ``budget_share`` of the context: a greedy
    decode under ``kvp`` with its scorer timed, next to the same decode under ``streaming`` and ``h2o``."""
    budget = max(16, int(len(ctx.context_ids) * budget_share))
    out: dict[str, float] = {"budget_tokens": budget}
    for policy in ("streaming", "h2o", "kvp"):
        seconds, scoring, scored = _timed_decode(loaded, ctx, policy, budget, steps)
        out[f"{policy}_ms_per_step"] = 1000 * seconds / steps
        if policy == "kvp":
            out |= {"kvp_scoring_ms_per_step": 1000 * scoring / steps, "kvp_tokens_scored_per_step": scored / steps}
    return out


def _timed_decode(loaded: LoadedModel, ctx: Context, policy: str, budget: int, steps: int) -> tuple[float, float, int]:
    """Prefill ``ctx`` under ``policy`` and ``budget``, then time a ``steps``-token greedy decode:
    (decode seconds, seconds inside kvp's scoring, tokens kvp scored during the decode)."""
    rt = Runtime(loaded, policy=policy, budget_tokens=budget)
    root = rt.new_tree_ids(ctx.context_ids)
    scores = getattr(rt.policy, "scores", None)
    spent, before = [0.0], scores.scored_tokens if scores is not None else 0
    if scores is not None:
        inner = scores.token_scores

        def timed(view):
            t0 = time.perf_counter()
            try:
                return inner(view)
            finally:
                spent[0] += time.perf_counter() - t0

        scores.token_scores = timed
    start = time.perf_counter()
    rt.expand(root, 1, SamplingParams(max_new_tokens=steps, temperature=0.0, stop_at_eos=False))
    scored = scores.scored_tokens - before if scores is not None else 0
    return time.perf_counter() - start, spent[0], scored
