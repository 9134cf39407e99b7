"""Speed vs naive Tree-of-Thought: the same recorded tree built three ways.

- ``runtime``: this runtime, replaying the trace under ``full`` (each block prefilled once over
  its ancestors' stored KV).
- ``naive``: what the reference ToT code does through an API: every node re-sends its whole
  path; here one forward over the path ids per node (teacher-forced, so the tree is the same).
- ``prefix_cache``: ``generate`` with a prefix cache: per expansion, the parent's path is
  prefilled once into a ``DynamicCache`` that is deep-copied for each child.

All three are teacher-forced on the recorded token ids (sampling again would grow another tree),
score every non-root token and count the tokens whose KV a forward computed ("prefill tokens").
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from arbor_runtime.loading import LoadedModel
from benchmarks.replay import ReplayRun
from benchmarks.trace import Trace

METHODS = ("runtime", "naive", "prefix_cache")


@dataclass(slots=True)
class Build:
    """One construction of a trace's tree.

    Attributes:
        method: one of :data:`METHODS`; seconds: wall time.
        model_seconds / runtime_seconds: time in model forwards / inside runtime calls (runtime
            only; the baselines are model time but for their small bookkeeping).
        prefill_tokens: tokens whose KV a forward computed; forward_calls: model calls.
        logprobs: per created node id, the log-probs of its recorded tokens.
    """

    method: str
    seconds: float
    prefill_tokens: int
    forward_calls: int
    model_seconds: float | None = None
    runtime_seconds: float | None = None
    logprobs: dict[int, list[float]] = field(default_factory=dict)


def build_runtime(loaded: LoadedModel, trace: Trace) -> Build:
    """(a) the runtime: a replay under ``full`` (one prefill per block, ancestors' KV reused)."""
    start = time.perf_counter()
    run = ReplayRun("full")
    run.start(loaded)
    rt = run.rt
    for op in trace.replay_ops():
        run.apply(op, trace)
    seconds = time.perf_counter() - start
    logprobs = {rec: list(node.logprobs) for rec, node in run.nodes.items() if node.parent is not None}
    m = rt.metrics
    tokens = m.prefill_tokens + m.decode_tokens
    return Build("runtime", seconds, tokens, m.forward_calls, m.model_seconds, m.runtime_seconds, logprobs)


@torch.inference_mode()
def build_naive(loaded: LoadedModel, trace: Trace) -> Build:
    """(b) naive ToT: one forward over the whole path per node (the prompt re-sent every time)."""
    model, device = loaded.model, loaded.device
    start, tokens, calls, logprobs = time.perf_counter(), 0, 0, {}
    for _, kids in trace.expand_groups():
        for kid in kids:
            rec = trace.nodes[kid]
            ids = torch.tensor([trace.path_ids(kid)], device=device)
            logits = model(input_ids=ids, logits_to_keep=len(rec.token_ids) + 1).logits[0, :-1]  # (T, V)
            logprobs[kid] = _token_logprobs(logits, rec.token_ids)
            tokens, calls = tokens + ids.shape[1], calls + 1
    return Build("naive", time.perf_counter() - start, tokens, calls, logprobs=logprobs)


@torch.inference_mode()
def build_prefix_cache(loaded: LoadedModel, trace: Trace) -> Build:
    """(c) a prefix cache per expansion: the parent's path once, deep-copied for every child."""
    from transformers import DynamicCache

    model, device = loaded.model, loaded.device
    start, tokens, calls, logprobs = time.perf_counter(), 0, 0, {}
    for parent, kids in trace.expand_groups():
        path = torch.tensor([trace.path_ids(parent)], device=device)
        cache = DynamicCache(config=model.config)
        last = model(input_ids=path, cache=cache, use_cache=True, logits_to_keep=1).logits[0]  # (1, V)
        tokens, calls = tokens + path.shape[1], calls + 1
        for kid in kids:
            rec = trace.nodes[kid]
            ids = torch.tensor([rec.token_ids], device=device)
            out = model(input_ids=ids, cache=copy.deepcopy(cache), use_cache=True, logits_to_keep=0).logits[0]
            logprobs[kid] = _token_logprobs(torch.cat([last, out[:-1]]), rec.token_ids)
            tokens, calls = tokens + ids.shape[1], calls + 1
    return Build("prefix_cache", time.perf_counter() - start, tokens, calls, logprobs=logprobs)


BUILDERS: dict[str, Callable[[LoadedModel, Trace], Build]] = {
    "runtime": build_runtime,
    "naive": build_naive,
    "prefix_cache": build_prefix_cache,
}


def expected_prefill_tokens(trace: Trace) -> dict[str, int]:
    """Prefill tokens each method must compute on ``trace`` (no model needed)."""
    groups = trace.expand_groups()
    return {
        "runtime": trace.total_tokens,
        "naive": sum(trace.nodes[k].end_pos for _, kids in groups for k in kids),
        "prefix_cache": sum(
            trace.nodes[p].end_pos + sum(len(trace.nodes[k].token_ids) for k in kids) for p, kids in groups
        ),
    }


def max_logprob_diff(a: Build, b: Build) -> float:
    """Largest |a - b| over every scored token of the nodes both builds scored."""
    common = a.logprobs.keys() & b.logprobs.keys()
    if common != a.logprobs.keys() or common != b.logprobs.keys():
        raise ValueError(f"{a.method} and {b.method} scored different nodes")
    diffs = [abs(x - y) for k in common for x, y in zip(a.logprobs[k], b.logprobs[k], strict=True)]
    return max(diffs, default=0.0)


def speed_compare(
    loaded: LoadedModel, trace: Trace, repeats: int = 3, warmup: int = 1, methods: tuple[str, ...] = METHODS
) -> dict[str, Any]:
    """Build the tree with every method ``warmup + repeats`` times (interleaved) in this process.

    Returns:
        JSON-friendly summary: per method the median / all wall times, prefill tokens, forward
        calls; the ratios of the runtime's median time and prefill tokens to each baseline; the
        runtime's overhead (time outside model forwards / total); the largest log-prob difference
        between the runtime and each baseline.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats} must be >= 1 and warmup={warmup} >= 0")
    unknown = set(methods) - set(BUILDERS)
    if unknown or "runtime" not in methods:
        raise ValueError(f"methods {sorted(methods)} must include 'runtime' and come from {', '.join(METHODS)}")
    builds: dict[str, list[Build]] = {m: [] for m in methods}
    for i in range(warmup + repeats):
        for m in methods:
            b = BUILDERS[m](loaded, trace)
            if i >= warmup:
                builds[m].append(b)
    return summarize(builds, trace)


def summarize(builds: dict[str, list[Build]], trace: Trace) -> dict[str, Any]:
    """Medians, ratios and overhead from repeated builds (see :func:`speed_compare`)."""
    out: dict[str, Any] = {"methods": {}, "ratios": {}, "max_logprob_diff": {}}
    for m, runs in builds.items():
        out["methods"][m] = {
            "median_seconds": statistics.median(b.seconds for b in runs),
            "seconds": [b.seconds for b in runs],
            "prefill_tokens": runs[0].prefill_tokens,
            "forward_calls": runs[0].forward_calls,
        }
    rt = builds["runtime"]
    med = out["methods"]["runtime"]["median_seconds"]
    for m in builds:
        if m == "runtime":
            continue
        base = out["methods"][m]
        out["ratios"][f"runtime/{m}"] = {
            "seconds": med / base["median_seconds"] if base["median_seconds"] else None,
            "prefill_tokens": out["methods"]["runtime"]["prefill_tokens"] / base["prefill_tokens"],
        }
        out["max_logprob_diff"][f"runtime-{m}"] = max_logprob_diff(rt[0], builds[m][0])
    fractions = [1 - b.model_seconds / b.runtime_seconds for b in rt if b.runtime_seconds]
    out["runtime_overhead"] = {
        "model_seconds": statistics.median(b.model_seconds for b in rt),
        "runtime_seconds": statistics.median(b.runtime_seconds for b in rt),
        "fraction": statistics.median(fractions) if fractions else None,
    }
    out["nodes"] = len(trace.nodes)
    out["scored_tokens"] = trace.scored_positions
    out["expected_prefill_tokens"] = expected_prefill_tokens(trace)
    return out


def _token_logprobs(logits: torch.Tensor, token_ids: list[int]) -> list[float]:
    """logits: (T, V), row i predicting token i; returns the T log-probs of ``token_ids``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(token_ids, device=logits.device).view(-1, 1)
    return logp.gather(-1, idx).squeeze(-1).tolist()
