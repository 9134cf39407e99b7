"""Linear (single-sequence) fidelity of the tree-blind policies next to kvpress's presses.

Protocol, the same on both sides and on the same token ids: prefill a few-shot context whole,
compress it once to a kept share, then teacher-force question + reference continuation (the
greedy continuation of the uncompressed model) and compare, per continuation step, the
next-token distribution with the uncompressed one: KL(full || compressed) and top-1 agreement.

The project side runs here (``Runtime.compress`` after the context's prefill); the kvpress side
runs in kvpress's own virtualenv (``benchmarks/kvpress_side.py``; kvpress pins
transformers < 5.3). They exchange JSON: token ids in, per-step KL / top-1 out.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from arbor_runtime import Node, Runtime, SamplingParams, build_policy
from arbor_runtime.loading import LoadedModel, default_cache_dir
from arbor_runtime.tasks.stepwise import format_example

log = logging.getLogger(__name__)

#: project policy -> its kvpress counterpart (None: no counterpart, shown for reference)
COUNTERPARTS: dict[str, str | None] = {
    "streaming": "streaming",
    "h2o": "observed_attention",
    "snapkv": "snapkv",
    "thinkv": None,
}
PRESSES = ("streaming", "observed_attention", "snapkv", "knorm")
#: "task:shots:question" -> a few-shot context from the shared data (600-2000 SmolLM2 tokens)
DEFAULT_CONTEXTS = ("gsm8k:6:0", "gsm8k:10:1", "math500:3:100", "math500:5:200")
KVPRESS_PIP = ("torch==2.13.0", "kvpress==0.5.5")  # torch pinned: an unpinned one pulls a CUDA build
KVPRESS_SIDE = Path(__file__).with_name("kvpress_side.py")
GSM8K_INSTRUCTION = 'Solve the math word problem step by step. End with a line "The answer is N."'
MATH_INSTRUCTION = "Solve the math problem step by step. Put the final answer in \\boxed{}."


@dataclass(slots=True)
class Context:
    """One benchmark context: token ids of the compressed context, the question, the continuation."""

    name: str
    context_ids: list[int]
    question_ids: list[int]
    continuation_ids: list[int] = field(default_factory=list)

    def to_request(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()}


# ---- contexts ------------------------------------------------------------------------------
def parse_spec(spec: str) -> tuple[str, int, int]:
    """ "gsm8k:5:0" -> ("gsm8k", 5 shots, question row 0)."""
    m = re.fullmatch(r"(gsm8k|math500):(\d+):(\d+)", spec)
    if not m:
        raise ValueError(f"context spec {spec!r} is not TASK:SHOTS:QUESTION with TASK one of gsm8k, math500")
    return m.group(1), int(m.group(2)), int(m.group(3))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} is missing (--data-dir points at the shared data folder)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gsm8k_steps(answer: str) -> tuple[str, ...]:
    """A GSM8K train answer as solution lines: calculator annotations out, "#### N" -> "The answer is N."."""
    lines = [re.sub(r"<<[^>]*>>", "", line).strip() for line in answer.splitlines() if line.strip()]
    return tuple(f"The answer is {line[4:].strip()}." if line.startswith("####") else line for line in lines)


def context_texts(data_dir: Path, spec: str) -> tuple[str, str]:
    """(context, question) texts of a spec: an instruction and SHOTS worked examples, then the question.

    GSM8K: shots are train rows 0..SHOTS-1, the question is test row QUESTION. MATH500 (test only):
    shots are the first SHOTS rows other than QUESTION.
    """
    task, shots, question = parse_spec(spec)
    if task == "gsm8k":
        train, test = _jsonl(data_dir / "gsm8k" / "train.jsonl"), _jsonl(data_dir / "gsm8k" / "test.jsonl")
        if question >= len(test) or shots > len(train):
            raise ValueError(f"context spec {spec!r}: gsm8k has {len(train)} train and {len(test)} test rows")
        examples = [format_example(r["question"], gsm8k_steps(r["answer"])) for r in train[:shots]]
        return "\n".join([GSM8K_INSTRUCTION + "\n", *examples]), "\n" + format_example(test[question]["question"])
    rows = _jsonl(data_dir / "math500" / "test.jsonl")
    if question >= len(rows) or shots >= len(rows):
        raise ValueError(f"context spec {spec!r}: math500 has {len(rows)} rows")
    shot_rows = [r for i, r in enumerate(rows) if i != question][:shots]
    examples = [format_example(r["problem"], (r["solution"].strip(),)) for r in shot_rows]
    return "\n".join([MATH_INSTRUCTION + "\n", *examples]), "\n" + format_example(rows[question]["problem"])


def build_context(tokenizer, data_dir: Path, spec: str) -> Context:
    context, question = context_texts(data_dir, spec)
    return Context(
        name=spec,
        context_ids=list(tokenizer(context, add_special_tokens=True)["input_ids"]),
        question_ids=list(tokenizer(question, add_special_tokens=False)["input_ids"]),
    )


# ---- the project side ----------------------------------------------------------------------
def kept_tokens(n: int, ratio: float) -> int:
    """Context tokens kept at ``compression_ratio`` ratio, counted as kvpress's ScorerPress does."""
    return int(n * (1 - ratio))


def compare(ref: torch.Tensor, logp: torch.Tensor) -> tuple[list[float], list[bool]]:
    """Per step KL(ref || logp) and top-1 agreement. ref, logp: (T, V) log-probs."""
    kl = (ref.exp() * (ref - logp)).sum(-1).clamp_min(0.0)
    return [float(x) for x in kl], [bool(x) for x in (ref.argmax(-1) == logp.argmax(-1))]


@dataclass(slots=True)
class Prefilled:
    """A runtime that has prefilled one context under one policy (no budget), and how long that took."""

    rt: Runtime
    root: Node
    seconds: float


def policy_variant(name: str) -> tuple[str, dict[str, Any]]:
    """``kvp`` -> (``kvp``, {}); ``kvp@head`` -> (``kvp``, {granularity: head}): a project policy at
    per-(layer, KV head) retention (``policy.granularity=head``)."""
    kind, _, granularity = name.partition("@")
    return kind, ({"granularity": granularity} if granularity else {})


def prefill(loaded: LoadedModel, ctx: Context, policy: str, **kwargs: Any) -> Prefilled:
    start = time.perf_counter()
    rt = Runtime(loaded, build_policy(policy, **kwargs))
    root = rt.new_tree_ids(ctx.context_ids)
    return Prefilled(rt, root, time.perf_counter() - start)


def fork(pre: Prefilled) -> tuple[Runtime, Node]:
    """A copy of the prefilled runtime's whole state (tree, KV, statistics) sharing its model and
    tokenizer, so one prefill serves every kept share; the copy's root."""
    rt = pre.rt
    copy_ = copy.deepcopy(rt, {id(rt.model): rt.model, id(rt.tokenizer): rt.tokenizer})
    return copy_, copy_.nodes[pre.root.id]


def reference_continuation(full: Prefilled, ctx: Context, steps: int) -> None:
    """Fill ``ctx.continuation_ids`` with the uncompressed model's greedy continuation of context + question."""
    rt, root = fork(full)
    question = rt.append_ids(root, ctx.question_ids)
    params = SamplingParams(max_new_tokens=steps, temperature=0.0, stop_at_eos=False)
    ctx.continuation_ids = list(rt.expand(question, 1, params)[0].token_ids)


@dataclass(slots=True)
class ProjectRun:
    """One policy at one kept share on one context: continuation log-probs (T, V), tokens kept,
    and which context tokens (block-local indices of the root, sorted) stayed."""

    logp: torch.Tensor
    kept_tokens: int
    seconds: float
    kept: torch.Tensor | None = None


def kept_of(rt: Runtime, block_id: int) -> torch.Tensor:
    """Which of a block's tokens stayed on the device: (k,) sorted block-local indices, or for a
    per-head block (``policy.granularity=head``) (L, H_kv, k) each layer's and KV head's own."""
    blk = rt.store.get(block_id)
    if blk.per_head:
        return blk.heads.clone()
    return blk.kept.clone()


def project_run(pre: Prefilled, ctx: Context, ratio: float | None) -> ProjectRun:
    """On a fork of the prefilled context: compress once to the kept share (``ratio`` None: not at
    all), then teacher-force question + continuation."""
    start = time.perf_counter()
    rt, root = fork(pre)
    blocks: dict[int, torch.Tensor] = {}
    rt.logits_hook = lambda node, logp: blocks.__setitem__(node.id, logp)
    kept = rt.compress(kept_tokens(root.length, ratio)) if ratio is not None else root.length
    kept_idx = kept_of(rt, root.id)
    node = rt.append_ids(root, ctx.question_ids + ctx.continuation_ids)
    logp = blocks[node.id][len(ctx.question_ids) :].float()
    return ProjectRun(logp, kept, time.perf_counter() - start, kept_idx)


def run_project(
    loaded: LoadedModel, contexts: list[Context], policies: list[str], ratios: list[float], steps: int
) -> list[dict[str, Any]]:
    """Per context: the reference continuation, then every policy x ratio against the uncompressed run.

    One prefill per context and policy (its state forked for each share); the prefill times of
    ``full`` and of each policy, measured in the same run, show what the statistics cost.
    """
    out = []
    for ctx in contexts:
        base = prefill(loaded, ctx, "full")
        reference_continuation(base, ctx, steps)
        full = project_run(base, ctx, None)
        runs, prefill_seconds = [], {"full": base.seconds}
        for policy in policies:
            kind, kwargs = policy_variant(policy)
            pre = prefill(loaded, ctx, kind, **kwargs)
            prefill_seconds[policy] = pre.seconds
            for ratio in ratios:
                run = project_run(pre, ctx, ratio)
                kl, top1 = compare(full.logp, run.logp)
                row = {"policy": policy, "compression_ratio": ratio, "kept_tokens": run.kept_tokens}
                runs.append(row | {"kl": kl, "top1": top1, "seconds": run.seconds})
                log.info("%s %s %s: mean KL %.4f", ctx.name, policy, ratio, sum(kl) / len(kl))
            del pre
        cont = torch.tensor(ctx.continuation_ids)
        reference = {
            "top1": full.logp.argmax(-1).tolist(),
            "token_logp": full.logp.gather(-1, cont.view(-1, 1)).squeeze(-1).tolist(),
        }
        out.append({"name": ctx.name, "prefill_seconds": prefill_seconds, "reference": reference, "runs": runs})
    return out


# ---- the kvpress side ----------------------------------------------------------------------
def kvpress_model_dir(spec: str) -> Path:
    """The safetensors folder both sides load (identical weights): SmolLM2's converted copy or a local dir."""
    if spec == "smollm2":
        path = default_cache_dir() / "smollm2-135m-instruct"
    elif Path(spec).expanduser().is_dir():
        path = Path(spec).expanduser()
    else:
        raise ValueError(f"model {spec!r}: the kvpress side needs 'smollm2' or a local model directory")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: load the model once in the project first")
    return path


def kvpress_python(venv: Path, create: bool) -> Path:
    """The kvpress virtualenv's python; with ``create``, make the venv first when it is missing
    (``python -m venv``, then ``pip install torch==2.13.0 kvpress==0.5.5``)."""
    python = venv / "bin" / "python"
    if not python.is_file():
        if not create:
            raise FileNotFoundError(f"--kvpress-venv {venv} has no bin/python; pass --create-venv to create it")
        log.info("creating the kvpress virtualenv in %s", venv)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", KVPRESS_PIP[0]], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *KVPRESS_PIP], check=True)
    probe = subprocess.run([str(python), "-c", "import kvpress"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"{python} cannot import kvpress ({probe.stderr.strip().splitlines()[-1:]})")
    return python


def run_kvpress(python: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Run kvpress_side.py in the kvpress venv on ``request``; returns its response."""
    with tempfile.TemporaryDirectory() as tmp:
        req, resp = Path(tmp) / "request.json", Path(tmp) / "response.json"
        req.write_text(json.dumps(request))
        subprocess.run([str(python), str(KVPRESS_SIDE), str(req), str(resp)], check=True)
        return json.loads(resp.read_text())


# ---- the table -----------------------------------------------------------------------------
def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summarize(project: list[dict[str, Any]], kvpress: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (method, share): KL and top-1 averaged over every step of every context.

    Methods: each project policy, and each kvpress press in both variants (``per_head`` as shipped,
    ``token``: its scores averaged over heads and layers, whole tokens kept).
    """
    cells: dict[tuple[str, str, float], list[tuple[list[float], list[bool]]]] = {}
    for ctx in project:
        for r in ctx["runs"]:
            cells.setdefault(("project", r["policy"], r["compression_ratio"]), []).append((r["kl"], r["top1"]))
    for ctx in kvpress["items"]:
        for r in ctx["runs"]:
            key = (f"kvpress/{r['variant']}", r["press"], r["compression_ratio"])
            cells.setdefault(key, []).append((r["kl"], r["top1"]))
    rows = []
    for (side, method, ratio), runs in cells.items():
        kl = [x for k, _ in runs for x in k]
        top1 = [float(x) for _, t in runs for x in t]
        rows.append(
            {
                "side": side,
                "method": method,
                "kept_share": round(1 - ratio, 6),
                "mean_kl": _mean(kl),
                "top1": _mean(top1),
                "context_mean_kl": [_mean(k) for k, _ in runs],
            }
        )
    return rows


def comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per project policy with a counterpart and share: its KL next to the press's (both variants)."""
    by = {(r["side"], r["method"], r["kept_share"]): r for r in rows}
    out = []
    for r in rows:
        peer = COUNTERPARTS.get(policy_variant(r["method"])[0]) if r["side"] == "project" else None
        if peer is None:
            continue
        head = by.get(("kvpress/per_head", peer, r["kept_share"]))
        token = by.get(("kvpress/token", peer, r["kept_share"]))
        if head is None:
            continue
        out.append(
            {
                "policy": r["method"],
                "press": peer,
                "kept_share": r["kept_share"],
                "kl": r["mean_kl"],
                "top1": r["top1"],
                "press_kl": head["mean_kl"],
                "press_top1": head["top1"],
                "token_kl": token["mean_kl"] if token else None,
                "token_top1": token["top1"] if token else None,
                "ratio_vs_press": r["mean_kl"] / max(head["mean_kl"], 1e-12),
                "ratio_vs_token": r["mean_kl"] / max(token["mean_kl"], 1e-12) if token else None,
            }
        )
    return sorted(
        out, key=lambda x: (list(COUNTERPARTS).index(policy_variant(x["policy"])[0]), x["policy"], -x["kept_share"])
    )


def prefill_cost(project: list[dict[str, Any]], contexts: list[Context]) -> dict[str, dict[str, float]]:
    """Per policy, prefill ms per context token over all contexts and its ratio to ``full`` (same run)."""
    tokens = sum(len(c.context_ids) for c in contexts)
    totals: dict[str, float] = {}
    for ctx in project:
        for policy, seconds in ctx["prefill_seconds"].items():
            totals[policy] = totals.get(policy, 0.0) + seconds
    return {p: {"ms_per_token": 1000 * t / tokens, "vs_full": t / totals["full"]} for p, t in totals.items()}
