"""The long-context bench: dense vs sparse reads (lychee, quest) and compressed contexts (kvp, h2o,
snapkv, streaming) on the RULER-style suite of :mod:`benchmarks.longctx.generator`.

Protocol, per item (its context ids C, question ids Q ending in "Answer:"):

- dense: ``Runtime(policy="full")`` prefills C as the root; Q[:-1] is appended (prefill); Q's last
  token is fed as a *decode step* (forced by a regex of its text, so it is the same token id),
  then greedy decode of up to ``max_new`` answer tokens.
- sparse (lychee, quest): a copy of the dense runtime after C's prefill, its decode steps reading
  through the policy's index (``benchmarks.sparse.attach``, as bench_sparse.py does) with
  ``token_budget`` = the share of len(C) (or a token count); then the same Q and decode. Prefill
  stays dense in the runtime, which is why Q's last token goes through a decode step: the first
  answer token is then read sparsely too.
- compressing (kvp, h2o, snapkv, streaming): ``Runtime(policy=P)`` (no budget) prefills C whole,
  collecting its statistics; a copy per share runs ``rt.compress(share * len(C))`` (the kept share
  is of the context; the question comes after compression, query-agnostic, as kvpress evaluates
  RULER); then the same Q and decode over the kept tokens.

Measured per item and method: the answer (the first line of the greedy text), its score against
the gold (generator.score), agreement with dense's answer, and at the first answer token that is
not whitespace (SmolLM2 writes " 39" as " ", "3", "9"; dense's leading whitespace tokens are forced
first, so both distributions have the same prefix): top-1 agreement and KL(dense || method);
tokens/s of the greedy answer decode (wall).
"""

from __future__ import annotations

import copy
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.sparse import attach
from arbor_runtime import LoadedModel, Node, Runtime, SamplingParams, build_policy
from arbor_runtime.policies import LycheePolicy, QuestPolicy
from arbor_runtime.sparse.reads import read_budget
from benchmarks.longctx.generator import Item, encode, normalise

SPARSE = {"lychee": LycheePolicy, "quest": QuestPolicy}
COMPRESSING = ("kvp", "h2o", "snapkv", "streaming")
POLICIES = (*SPARSE, *COMPRESSING)


@dataclass(frozen=True, slots=True)
class Method:
    """A policy at one budget: ``share`` of the context's tokens, or ``tokens`` outright; a sparse
    policy with neither runs at its defaults (``@default``: its own read rule); dense: neither."""

    policy: str
    share: float | None = None
    tokens: int | None = None

    @property
    def label(self) -> str:
        if self.policy == "dense":
            return "dense"
        if self.share is None and self.tokens is None:
            return f"{self.policy}@default"
        return f"{self.policy}@{self.tokens}" if self.tokens is not None else f"{self.policy}@{self.share:.0%}"

    def build(self, context_tokens: int):
        """The sparse policy this method reads through: its defaults, or a fixed ``token_budget`` = the
        budget at every layer (no share, no dense layers: the budget as given)."""
        cls = SPARSE[self.policy]
        if self.share is None and self.tokens is None:
            return cls()
        return cls(token_budget=self.budget(context_tokens), token_share=0.0, dense_layers=0)

    def budget(self, context_tokens: int) -> int:
        """Tokens read (sparse) or kept (compressing) of a ``context_tokens``-token context."""
        if self.share is None and self.tokens is None:  # a sparse policy's default read rule
            policy = SPARSE[self.policy]()
            return read_budget(context_tokens, policy.token_budget, policy.token_share)
        return self.tokens if self.tokens is not None else max(1, int(self.share * context_tokens))


def parse_budget(text: str) -> tuple[float | None, int | None]:
    """ "0.25" -> a share (0 < s < 1); "1024" -> a token count (integer >= 1); "default" -> (None, None)."""
    if text.strip() == "default":
        return None, None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if 0.0 < value < 1.0:
        return value, None
    if value >= 1.0 and value == int(value):
        return None, int(value)
    raise ValueError(f"budget {text!r} must be a share in (0, 1), a whole number of tokens >= 1, or 'default'")


def methods(policies: Sequence[str], budgets: Sequence[str]) -> list[Method]:
    """Dense first, then every policy at every budget ("default" applies to the sparse policies only)."""
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise ValueError(f"unknown policy {bad[0]!r}; valid: {', '.join(POLICIES)}")
    parsed = [parse_budget(b) for b in budgets]
    return [Method("dense")] + [
        Method(p, s, t) for p in policies for s, t in parsed if p in SPARSE or (s, t) != (None, None)
    ]


# ---- runtime steps --------------------------------------------------------------------------------
def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0.0, stop_at_eos=True)


def force(rt: Runtime, node: Node, ids: Sequence[int]) -> Node:
    """A child of ``node`` holding exactly ``ids``, fed as decode steps (a regex of their text)."""
    text = rt.tokenizer.decode(list(ids))
    params = SamplingParams(max_new_tokens=len(ids), temperature=0.0, stop_at_eos=False, regex=re.escape(text))
    child = rt.expand(node, 1, params)[0]
    if list(child.token_ids) != list(ids):
        raise RuntimeError(f"forcing {text!r}: decode produced ids {child.token_ids}, wanted {list(ids)}")
    return child


def fork(rt: Runtime, root: Node) -> tuple[Runtime, Node]:
    """A copy of ``rt``'s whole state sharing its model and tokenizer; the copy's ``root``."""
    clone = copy.deepcopy(rt, {id(rt.model): rt.model, id(rt.tokenizer): rt.tokenizer})
    return clone, clone.nodes[root.id]


@dataclass(slots=True)
class Answer:
    """One method's answer to one item: the greedy ids after the question, the node after Q's last
    token, and the decode's wall seconds."""

    ids: list[int]
    last: Node
    seconds: float


def answer(rt: Runtime, root: Node, question: Sequence[int], max_new: int) -> Answer:
    """Append the question (its last token as a decode step) below ``root`` and decode greedily."""
    last = force(rt, rt.append_ids(root, list(question[:-1])), question[-1:])
    start = time.perf_counter()
    child = rt.expand(last, 1, greedy(max_new))[0]
    return Answer(list(child.token_ids), last, time.perf_counter() - start)


def leading_space(tokenizer, ids: Sequence[int]) -> int:
    """How many of ``ids``' first tokens decode to whitespace only (all but the last at most)."""
    n = 0
    while n < len(ids) - 1 and not tokenizer.decode([ids[n]]).strip():
        n += 1
    return n


def first_logprobs(rt: Runtime, ans: Answer, prefix: Sequence[int]) -> torch.Tensor:
    """(V,) log-probs of the first non-whitespace answer token, after forcing dense's ``prefix``."""
    node = force(rt, ans.last, prefix) if prefix else ans.last
    return rt.next_token_logprobs(node).float()


def answer_text(tokenizer, ids: Sequence[int]) -> str:
    """The answer: the first non-empty line of the decoded ids, trimmed."""
    lines = [line.strip() for line in tokenizer.decode(list(ids), skip_special_tokens=True).splitlines()]
    return next((line for line in lines if line), "")


# ---- one item ---------------------------------------------------------------------------------------
def run_item(loaded: LoadedModel, item: Item, plan: Sequence[Method], max_new: int = 16) -> list[dict[str, Any]]:
    """Every method of ``plan`` (dense first) on ``item``: one row each (see the module docstring)."""
    tok = loaded.tokenizer
    ctx, question = encode(tok, item.context, item.question)
    start = time.perf_counter()
    base = Runtime(loaded, "full")
    base_root = base.new_tree_ids(ctx)
    dense_prefill = time.perf_counter() - start
    rt, root = fork(base, base_root)
    dense = answer(rt, root, question, max_new)
    prefix = dense.ids[: leading_space(tok, dense.ids)]
    ref = first_logprobs(rt, dense, prefix)
    dense_text = answer_text(tok, dense.ids)
    del rt, root
    rows = []
    prefilled: dict[str, tuple[Runtime, Node, float]] = {}
    for method in plan:
        prefill_s = dense_prefill
        if method.policy == "dense":
            ans, logp, kept = dense, ref, len(ctx)
        else:
            budget = method.budget(len(ctx))
            if method.policy in SPARSE:
                rt, root = fork(base, base_root)
                attach(rt, method.build(len(ctx)))
                kept = len(ctx)
            else:
                if method.policy not in prefilled:
                    start = time.perf_counter()
                    prt = Runtime(loaded, build_policy(method.policy))
                    prefilled[method.policy] = (prt, prt.new_tree_ids(ctx), time.perf_counter() - start)
                prt, proot, prefill_s = prefilled[method.policy]
                rt, root = fork(prt, proot)
                kept = rt.compress(min(budget, len(ctx)))
            ans = answer(rt, root, question, max_new)
            logp = first_logprobs(rt, ans, prefix)
            del rt, root
        text = answer_text(tok, ans.ids)
        kl = float((ref.exp() * (ref - logp)).sum().clamp_min(0.0))
        rows.append({
            "task": item.task, "length": item.length, "index": item.index, "tokens": item.tokens,
            "method": method.label, "policy": method.policy, "share": method.share,
            "budget_tokens": None if method.policy == "dense" else budget,
            "kept_tokens": kept, "answer": text, "answers": list(item.answers),
            "score": item.score(text), "correct": item.correct(text),
            "agree": normalise(text) == normalise(dense_text),
            "first_agree": bool(ref.argmax() == logp.argmax()), "kl_first": kl,
            "answer_tokens": len(ans.ids), "decode_tok_s": len(ans.ids) / ans.seconds if ans.seconds else None,
            "prefill_s": prefill_s,
        })  # fmt: skip
    return rows


# ---- the whole run ----------------------------------------------------------------------------------
def run(loaded: LoadedModel, items: Sequence[Item], plan: Sequence[Method], max_new: int = 16, progress=None,
        done=None):  # fmt: skip
    """Rows of every item (``progress(i, item)`` is called before each, ``done(rows so far)`` after each)."""
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    longest = max(it.tokens for it in items) + max_new + 8
    if limit is not None and longest > limit:
        raise ValueError(f"items of {longest - max_new - 8} tokens do not fit the model's {limit} positions")
    rows = []
    for i, item in enumerate(items):
        if progress is not None:
            progress(i, item)
        rows += run_item(loaded, item, plan, max_new)
        if done is not None:
            done(rows)
    return rows


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (task, length, method): items, accuracy, mean score, agreement with dense, first-token
    agreement, mean KL of the first answer token, median decode tokens/s; with several tasks, also
    per (length, method) over all of them (task "all")."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["length"], r["method"])].append(r)
    if len({r["task"] for r in rows}) > 1:
        for r in rows:
            groups[("all", r["length"], r["method"])].append(r)
    out = []
    for (task, length, method), rs in groups.items():
        speeds = [r["decode_tok_s"] for r in rs if r["decode_tok_s"] is not None]
        out.append({
            "task": task, "length": length, "method": method, "items": len(rs),
            "accuracy": statistics.mean(float(r["correct"]) for r in rs),
            "score": statistics.mean(r["score"] for r in rs),
            "agree": statistics.mean(float(r["agree"]) for r in rs),
            "first_agree": statistics.mean(float(r["first_agree"]) for r in rs),
            "kl_first": statistics.mean(r["kl_first"] for r in rs),
            "decode_tok_s": statistics.median(speeds) if speeds else None,
        })  # fmt: skip
    return out
