"""The long-context bench: dense vs sparse reads (lychee, quest, and oracle_topk, their exact top-k
bound, with oracle_chunks, the same bound over lychee's chunks) and compressed contexts (kvp, h2o,
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
  RULER); then the same Q and decode over the kept tokens. A policy that records no attention
  statistics (kvp, streaming: ``needs_attention`` False) prefills exactly as ``full`` does, so its
  copies are made from the dense prefill with the policy swapped in (:func:`fork`'s ``policy``):
  the same K/V and records, one prefill fewer each. When h2o is in the plan, that one prefill is
  h2o's (its all-query attention record is computed after each layer's output, so the K/V are
  those of a plain prefill) and dense, lychee, quest, kvp, streaming copy it with their policy
  swapped in; snapkv prefills under its own policy (its record is of the last window of queries).
  ``reuse_prefill=False`` prefills each compressing policy anew and dense under ``full``;
  tests/test_longctx.py checks both give the same rows.
- answers: the answer is the first sentence of the first non-empty line of the greedy text
  (:func:`answer_text`: ": tiger." of ": tiger. The special magic word for ..."); the decode stops
  once it is complete (:func:`answer`), so ``answer_tokens`` counts the tokens up to its end (or
  ``max_new``). What follows the answer's sentence is the model running on, not the answer.

Measured per item and method: the answer, its score against the gold (generator.score), agreement
with dense's answer (the same :func:`answer_key`: the answer normalised, without the punctuation
around it), and at the first answer token that is
not whitespace (SmolLM2 writes " 39" as " ", "3", "9"; dense's leading whitespace tokens are forced
first, so both distributions have the same prefix): top-1 agreement and KL(dense || method);
tokens/s of the greedy answer decode (wall). For lychee and quest, at the question's last token (the
decode step before the answer, untimed), the index's recall of the oracle (``recall_oracle``, per
layer ``recall_layers`` and per KV head ``recall_heads``): of the keys oracle_topk would retrieve there
at the same budget beyond the sinks, window and blocks read whole, the share the index's selection read too
(:class:`~arbor_runtime.sparse.oracle.RecallStep`).
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import gc
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from arbor_runtime import LoadedModel, Node, Runtime, SamplingParams, build_policy
from arbor_runtime.planner import MemoryConfig
from arbor_runtime.policies import LycheePolicy, OracleTopKPolicy, Policy, QuestPolicy
from arbor_runtime.runtime import bind_policy
from arbor_runtime.sparse import SparseStep
from arbor_runtime.sparse.oracle import RecallStep
from arbor_runtime.sparse.reads import read_budget
from benchmarks.longctx.generator import Item, encode, normalise
from benchmarks.sparse import attach

#: oracle_topk: the exact top-k at the same read rule, a bound (it scores every key: slower than dense);
#: oracle_chunks: the same over lychee's chunks (oracle_topk -> oracle_chunks: what lychee's chunk
#: boundaries lose; oracle_chunks -> lychee: what its centroid score loses)
SPARSE = {
    "lychee": LycheePolicy, "quest": QuestPolicy, "oracle_topk": OracleTopKPolicy,
    "oracle_chunks": partial(OracleTopKPolicy, chunks="lychee"),
}  # fmt: skip
ORACLES = ("oracle_topk", "oracle_chunks")
#: what an answer is and how the decode stops: 1, the first line (16 tokens); 2, the first sentence of
#: the first line (:func:`answer_text`), compared by :func:`answer_key`. Rows of one rows file share it.
PROTOCOL = 2
COMPRESSING = ("kvp", "h2o", "snapkv", "streaming")
POLICIES = (*SPARSE, *COMPRESSING)


def sparse_policy(name: str):
    """The constructor of a sparse method, None for any other name: ``lychee``, or a variant with its
    knobs after a colon, joined by ``+`` (``lychee:min_chunk_tokens=2+max_chunk_tokens=4``: a change to
    the index measured beside the default). ValueError names a bad knob or value (nothing is loaded)."""
    base, _, args = name.partition(":")
    if base not in SPARSE:
        return None
    knobs: dict[str, Any] = {}
    for part in filter(None, args.split("+")):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"policy {name!r}: {part!r} is not knob=value")
        knobs[key] = _scalar(value)
    made = partial(SPARSE[base], **knobs)
    try:
        made()
    except (TypeError, ValueError) as err:
        raise ValueError(f"policy {name!r}: {err}") from None
    return made


def _scalar(text: str) -> Any:
    """ "4" -> 4, "0.5" -> 0.5, "true" -> True, "[7/9]" -> [7, 9] (a list of integers, "/" apart: the
    methods are "," apart), anything else the text."""
    if text.startswith("[") and text.endswith("]"):
        try:
            return [int(x) for x in text[1:-1].split("/") if x.strip()]
        except ValueError:
            return text
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


def check_policy(name: str) -> str:
    """``name`` when it is a policy of the suite (a sparse variant included), else ValueError."""
    if name not in POLICIES and sparse_policy(name) is None:
        valid = ", ".join(POLICIES)
        raise ValueError(f"unknown {name!r}; valid: {valid} (a sparse one may add ':knob=value+...')")
    return name


def is_oracle(name: str) -> bool:
    return name.partition(":")[0] in ORACLES


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
        cls = sparse_policy(self.policy)
        if self.share is None and self.tokens is None:
            return cls()
        return cls(token_budget=self.budget(context_tokens), token_share=0.0, dense_layers=0, dense_below=0)

    def budget(self, context_tokens: int) -> int:
        """Tokens read (sparse) or kept (compressing) of a ``context_tokens``-token context."""
        if self.share is None and self.tokens is None:  # a sparse policy's default read rule
            policy = sparse_policy(self.policy)()
            if context_tokens < policy.dense_below:  # the policy reads such a context dense
                return context_tokens
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
    for p in policies:
        check_policy(p)
    parsed = [parse_budget(b) for b in budgets]
    return [Method("dense")] + [
        Method(p, s, t) for p in policies for s, t in parsed if sparse_policy(p) or (s, t) != (None, None)
    ]


# ---- runtime steps --------------------------------------------------------------------------------
def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0.0, stop_at_eos=True)


def force(rt: Runtime, node: Node, ids: Sequence[int]) -> Node:
    """A descendant of ``node`` holding exactly ``ids``, fed as decode steps, one token per step
    (each a regex of that token's text alone: a regex of the whole text could take another
    tokenization of it, "\\n\\n" as one token where dense wrote two)."""
    for tid in ids:
        text = rt.tokenizer.decode([tid])
        params = SamplingParams(max_new_tokens=1, temperature=0.0, stop_at_eos=False, regex=re.escape(text))
        node = rt.expand(node, 1, params)[0]
        if list(node.token_ids) != [tid]:
            raise RuntimeError(f"forcing {text!r}: decode produced ids {node.token_ids}, wanted [{tid}]")
    return node


def fork(rt: Runtime, root: Node, policy: Policy | None = None) -> tuple[Runtime, Node]:
    """A copy of ``rt``'s whole state sharing its model and tokenizer; the copy's ``root``.

    ``policy``: the copy runs under this (bound) policy instead of a copy of ``rt``'s: every part
    of the runtime that holds the policy (memory manager, planner, prefix index) gets it, and the
    planner's memory config is read off it. Only for a policy with the same KV budget that reads
    no attention record, or reads the one ``rt``'s prefill recorded (the same observation window);
    the K/V of a prefill are the same with or without the record (the statistics are computed after
    each layer's output)."""
    memo: dict[int, Any] = {id(rt.model): rt.model, id(rt.tokenizer): rt.tokenizer}
    if policy is not None:
        src, new = rt.policy.capabilities, policy.capabilities
        same_record = not new.needs_attention or (
            src.needs_attention and src.observation_window == new.observation_window
        )
        if policy.kv_budget_tokens != rt.policy.kv_budget_tokens or not same_record:
            raise ValueError(f"fork: policy {policy.name} does not prefill as {rt.policy.name} does")
        memo[id(rt.policy)] = policy
        memo[id(rt.planner.config)] = MemoryConfig.of(policy)
    clone = copy.deepcopy(rt, memo)
    return clone, clone.nodes[root.id]


@dataclass(slots=True)
class Answer:
    """One method's answer to one item: the greedy ids after the question, the node after Q's last
    token, and the decode's wall seconds."""

    ids: list[int]
    last: Node
    seconds: float


#: where an answer's first sentence ends: ".", "!" or "?" before whitespace and a capital ("tiger. The
#: special ..." ends at "tiger."; "1. glass 2. stone" goes on; "4581042." at the line's end ends it)
SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z])")
#: stop strings that may end the answer's first sentence or line (:func:`answer_done` decides)
ANSWER_STOPS = ["\n", ". ", "! ", "? "]


def answer_done(text: str) -> bool:
    """The answer in ``text`` is complete: it has content and its first line ended (a newline after
    it) or its first sentence did (:data:`SENTENCE_END`)."""
    lead = text.lstrip()
    if not lead:
        return False
    line, *rest = lead.split("\n", 1)
    return bool(rest) or SENTENCE_END.search(line) is not None


def answer(
    rt: Runtime, root: Node, question: Sequence[int], max_new: int, first_line: bool = True, asked=None
) -> Answer:
    """Append the question (its last token as a decode step) below ``root`` and decode greedily.

    ``first_line``: the decode stops once the answer (:func:`answer_text`: the first sentence of the
    first non-empty line) is complete (:func:`answer_done`) rather than always running ``max_new``
    tokens: the answer is the same, the decode shorter. It decodes in pieces that stop at a newline
    or a sentence mark; a piece that ends before the answer is complete ("1. glass" is no sentence
    end) is continued from its node, greedily, up to ``max_new`` tokens in all. ``asked()``, if given,
    is called once the question's last token is in (before the timed decode)."""
    last = force(rt, rt.append_ids(root, list(question[:-1])), question[-1:])
    if asked is not None:
        asked()
    start = time.perf_counter()
    ids: list[int] = []
    node = last
    while True:
        params = SamplingParams(
            max_new_tokens=max_new - len(ids), temperature=0.0, stop_at_eos=True,
            stop=ANSWER_STOPS if first_line else [],
        )  # fmt: skip
        child = rt.expand(node, 1, params)[0]
        ids += child.token_ids
        text = rt.tokenizer.decode(ids, skip_special_tokens=True)
        if child.stop_reason != "stop" or len(ids) >= max_new or answer_done(text):
            break
        node = child
    return Answer(ids, last, time.perf_counter() - start)


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
    """The answer: the first non-empty line of the decoded ids, trimmed, up to the end of its first
    sentence (:data:`SENTENCE_END`): ": tiger. The special magic word for ..." answers ": tiger."."""
    lines = [line.strip() for line in tokenizer.decode(list(ids), skip_special_tokens=True).splitlines()]
    line = next((line for line in lines if line), "")
    end = SENTENCE_END.search(line)
    return line[: end.end()] if end else line


def answer_key(text: str) -> str:
    """What two answers are compared on: normalised, without the punctuation around it (": tiger.",
    '"tiger"' and "Tiger" are one answer; "4." and "4581042." are two)."""
    return re.sub(r"^[^0-9a-z]+|[^0-9a-z]+$", "", normalise(text))


# ---- one item ---------------------------------------------------------------------------------------
def run_item(
    loaded: LoadedModel,
    item: Item,
    plan: Sequence[Method],
    max_new: int = 16,
    skip: frozenset[str] = frozenset(),
    reuse_prefill: bool = True,
) -> list[dict[str, Any]]:
    """Every method of ``plan`` (dense first) on ``item``: one row each (see the module docstring).

    ``skip``: method labels not to run (rows a resumed run has already); dense always runs (it is
    the reference) but gets no row when skipped. ``reuse_prefill`` (see the module docstring):
    one prefill serves every method but snapkv (True) or each compressing policy prefills anew
    (False); the rows are the same but for the timings."""
    tok = loaded.tokenizer
    ctx, question = encode(tok, item.context, item.question)
    start = time.perf_counter()
    # the shared prefill: with h2o's all-query attention record when h2o is in the plan (one prefill fewer)
    shared = reuse_prefill and any(m.policy == "h2o" for m in plan)
    base = Runtime(loaded, build_policy("h2o") if shared else "full")
    base_root = base.new_tree_ids(ctx)
    dense_prefill = time.perf_counter() - start

    def full() -> Policy | None:  # the copy's policy for dense reads (None: the base is full already)
        return build_policy("full") if shared else None

    rt, root = fork(base, base_root, full())
    dense = answer(rt, root, question, max_new)
    prefix = dense.ids[: leading_space(tok, dense.ids)]
    ref = first_logprobs(rt, dense, prefix)
    dense_text = answer_text(tok, dense.ids)
    del rt, root
    rows = []
    prefilled: dict[str, tuple[Runtime, Node, float]] = {}
    bound: dict[str, Policy] = {}
    for method in plan:
        if method.label in skip:
            continue
        prefill_s = dense_prefill
        read = 1.0  # the share of the resident context the answer's decode steps read (sparse: measured)
        recall: list[tuple] = []  # (layer, the index's recall of the oracle, per KV head) at the question's step
        asked = None
        if method.policy == "dense":
            ans, logp, kept = dense, ref, len(ctx)
        else:
            budget = method.budget(len(ctx))
            if sparse_policy(method.policy) is not None:
                rt, root = fork(base, base_root, full())
                sparse = attach(rt, method.build(len(ctx)))
                if not is_oracle(method.policy):  # the question's step also measures the oracle's recall
                    sparse.step_type, sparse.recall = RecallStep, recall

                    def asked(sparse=sparse) -> None:
                        sparse.step_type = SparseStep

                kept = len(ctx)
            else:
                policy = build_policy(method.policy)
                if shared and method.policy == "h2o":  # the shared prefill is h2o's own
                    rt, root = fork(base, base_root)
                elif reuse_prefill and not policy.capabilities.needs_attention:  # prefills as full does: the dense one
                    if method.policy not in bound:  # bound once (kvp loads its weights), copied per share
                        bind_policy(policy, loaded.model)
                        bound[method.policy] = policy
                    rt, root = fork(base, base_root, copy.deepcopy(bound[method.policy]))
                else:
                    if method.policy not in prefilled:
                        start = time.perf_counter()
                        prt = Runtime(loaded, policy)
                        prefilled[method.policy] = (prt, prt.new_tree_ids(ctx), time.perf_counter() - start)
                    prt, proot, prefill_s = prefilled[method.policy]
                    rt, root = fork(prt, proot)
                kept = rt.compress(min(budget, len(ctx)))
            ans = answer(rt, root, question, max_new, asked=asked)
            logp = first_logprobs(rt, ans, prefix)
            if rt.backend.sparse is not None:
                read = rt.backend.sparse.stats.read_fraction
            del rt, root
        text = answer_text(tok, ans.ids)
        kl = float((ref.exp() * (ref - logp)).sum().clamp_min(0.0))
        rows.append({
            "task": item.task, "length": item.length, "index": item.index, "seed": item.seed,
            "tokens": item.tokens, "max_new": max_new,
            "method": method.label, "policy": method.policy, "share": method.share,
            "budget_tokens": None if method.policy == "dense" else budget,
            "kept_tokens": kept, "read_fraction": read, "answer": text, "answers": list(item.answers),
            "score": item.score(text), "correct": item.correct(text),
            "agree": answer_key(text) == answer_key(dense_text),
            "first_agree": bool(ref.argmax() == logp.argmax()), "kl_first": kl,
            "answer_tokens": len(ans.ids), "decode_tok_s": len(ans.ids) / ans.seconds if ans.seconds else None,
            "prefill_s": prefill_s, **recall_fields(recall),
        })  # fmt: skip
    return rows


def recall_fields(recall: Sequence[tuple[int, float, list[float | None]]]) -> dict[str, Any]:
    """``recall_oracle`` (the mean over layers), ``recall_layers`` (per layer, in order) and
    ``recall_heads`` (per KV head, the mean over the layers where the oracle retrieved anything for it)
    of one step's (layer, recall, per-head recalls); None for all three when none was measured (dense,
    compressing, the oracles, a step attended dense because its budget covered the context)."""
    if not recall:
        return {"recall_oracle": None, "recall_layers": None, "recall_heads": None}
    ordered = sorted(recall, key=lambda x: x[0])
    layers = [value for _, value, _ in ordered]
    per_head = zip(*(heads for _, _, heads in ordered), strict=True)
    heads = [statistics.mean(known) if (known := [v for v in h if v is not None]) else None for h in per_head]
    return {"recall_oracle": statistics.mean(layers), "recall_layers": layers, "recall_heads": heads}


# ---- the whole run ----------------------------------------------------------------------------------
def resident_gb() -> float | None:
    """This process's resident memory in GB (Linux; None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1e6
    except (OSError, StopIteration, ValueError):
        return None


def release_memory() -> None:
    """Collect garbage and give the allocator's free pages back to the system (glibc ``malloc_trim``).

    An item's runtimes (a deepcopy per method of a context's KV, prefill scratch of every size) are
    freed when it ends, but glibc keeps the freed pages in its heaps: a 2K/4K run was killed for
    memory at 14.9 GB after 36 items, an 8K run held 10.4 GB after 6, while one item needs under 2 GB.
    """
    gc.collect()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def item_key(row_or_item) -> tuple:
    """(task, length, index, seed) of an item or of one of its rows: what a resumed run matches on."""
    get = row_or_item.get if isinstance(row_or_item, dict) else lambda k: getattr(row_or_item, k)
    return get("task"), get("length"), get("index"), get("seed")


def run(
    loaded: LoadedModel,
    items: Sequence[Item],
    plan: Sequence[Method],
    max_new: int = 16,
    progress=None,
    done=None,
    have: dict[tuple, set[str]] | None = None,
    reuse_prefill: bool = True,
) -> list[dict[str, Any]]:
    """Rows of every item (``progress(i, item, todo)`` is called before each with the labels it will
    run, ``done(item rows)`` after each item that ran). ``have``: per :func:`item_key`, the method
    labels that already have rows (a resumed run); those are not run again, and an item with all of
    the plan's labels is skipped whole (no prefill)."""
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    longest = max(it.tokens for it in items) + max_new + 8
    if limit is not None and longest > limit:
        raise ValueError(
            f"items of {longest - max_new - 8} tokens do not fit the model's {limit} positions with "
            f"{max_new} answer tokens: use lengths <= {limit - max_new - 8}"
        )
    have = have or {}
    rows = []
    for i, item in enumerate(items):
        skip = frozenset(have.get(item_key(item), ()))
        todo = [m.label for m in plan if m.label not in skip]
        if progress is not None:
            progress(i, item, todo)
        if not todo:
            continue
        new = run_item(loaded, item, plan, max_new, skip, reuse_prefill)
        release_memory()
        for row in new:
            row["rss_gb"] = resident_gb()  # after the item, its memory released: stays flat over a run
        rows += new
        if done is not None:
            done(new)
    return rows


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% at z = 1.96) of a proportion ``successes / n``; (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def prefix_agree(answer: str, dense: str) -> bool:
    """The shorter of two answers (normalised, by words) begins the longer: ": tiger." and ": tiger.
    The special magic word" agree (one answer stopped, the other ran on to the token limit); the
    strict ``agree`` of a row asks for the same first line."""
    a, b = normalise(answer).split(), normalise(dense).split()
    n = min(len(a), len(b))
    return a[:n] == b[:n] and (n > 0 or len(a) == len(b))


def against_dense(rows: Sequence[dict[str, Any]], dense: dict[tuple, dict[str, Any]]) -> dict[str, Any]:
    """One group's figures against the dense row of each item (:func:`summarise`): accuracy retained
    on the items dense answers correctly (with its Wilson interval and n), the share of dense's
    context attended, and the median per-item ratio of decode tokens/s to dense's."""
    pairs = [(r, dense[item_key(r)]) for r in rows if item_key(r) in dense]
    right = [r for r, d in pairs if d.get("correct")]
    hits = sum(bool(r.get("correct")) for r in right)
    reads = [
        r["kept_tokens"] / d["kept_tokens"] * (r["read_fraction"] if r.get("read_fraction") is not None else 1.0)
        for r, d in pairs if r.get("kept_tokens") is not None and d.get("kept_tokens")
    ]  # fmt: skip
    speeds = [(r.get("decode_tok_s"), d.get("decode_tok_s")) for r, d in pairs]
    ratios = [mine / theirs for mine, theirs in speeds if mine and theirs]
    return {
        "dense_correct": len(right) if pairs else None,
        "retained": hits / len(right) if right else None,
        "retained_ci": list(wilson(hits, len(right))) if right else None,
        "context_read": statistics.mean(reads) if reads else None,
        "x_dense": statistics.median(ratios) if ratios else None,
    }


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (task, length, method): items, accuracy, mean score, agreement with dense (the same
    first line), prefix agreement with dense (:func:`prefix_agree`, from the dense row of the same
    item), first-token agreement (each proportion with its 95% Wilson interval, ``<name>_ci`` =
    [lo, hi]), mean KL of the first answer token, median decode tokens/s, mean prefill seconds, the
    mean share of the context the decode read (``read_fraction``); with several tasks, also per
    (length, method) over all of them (task "all"). Sorted by task (as first seen, "all" last),
    length, then method as first seen.

    Against the dense row of the same item (measured in the same run, so its speed compares):
    ``retained`` is accuracy retained, the share of the items dense answers correctly that the method
    answers correctly too (``retained_ci`` its Wilson interval, ``dense_correct`` how many such items);
    ``context_read`` the mean share of dense's context the decode attended (kept tokens over dense's,
    times ``read_fraction``: 1.0 for dense and for a sparse read that read everything, about the kept
    share for an eviction policy); ``x_dense`` the median over items of the method's decode tokens/s
    over dense's. Each is None where no item has a dense row (or the rows lack the field)."""
    dense = {item_key(r): r for r in rows if r["method"] == "dense"}
    answers = {key: r["answer"] for key, r in dense.items()}
    rows = [r | {"prefix_agree": prefix_agree(r["answer"], answers.get(item_key(r), ""))} for r in rows]
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["length"], r["method"])].append(r)
    if len({r["task"] for r in rows}) > 1:
        for r in rows:
            groups[("all", r["length"], r["method"])].append(r)
    tasks = list(dict.fromkeys(r["task"] for r in rows)) + ["all"]
    order = list(dict.fromkeys(r["method"] for r in rows))
    out = []
    for task, length, method in sorted(groups, key=lambda k: (tasks.index(k[0]), k[1], order.index(k[2]))):
        rs = groups[(task, length, method)]
        speeds = [r["decode_tok_s"] for r in rs if r["decode_tok_s"] is not None]
        reads = [r["read_fraction"] for r in rs if r.get("read_fraction") is not None]  # older rows have none
        recalls = [r["recall_oracle"] for r in rs if r.get("recall_oracle") is not None]
        entry = {
            "task": task, "length": length, "method": method, "policy": rs[0]["policy"], "share": rs[0]["share"],
            "items": len(rs), "tokens": statistics.mean(r["tokens"] for r in rs),
            "score": statistics.mean(r["score"] for r in rs),
            "kl_first": statistics.mean(r["kl_first"] for r in rs),
            "decode_tok_s": statistics.median(speeds) if speeds else None,
            "prefill_s": statistics.mean(r["prefill_s"] for r in rs),
            "read_fraction": statistics.mean(reads) if reads else None,
            "recall_oracle": statistics.mean(recalls) if recalls else None,
        }  # fmt: skip
        pairs = (("accuracy", "correct"), ("agree", "agree"), ("prefix_agree", "prefix_agree"), ("first_agree",) * 2)
        for name, field in pairs:
            hits = sum(bool(r[field]) for r in rs)
            entry[name], entry[f"{name}_ci"] = hits / len(rs), list(wilson(hits, len(rs)))
        out.append(entry | against_dense(rs, dense))
    return out
