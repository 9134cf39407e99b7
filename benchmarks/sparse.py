"""Sparse decode attention vs dense: speed per decode step and fidelity of the next-token distribution.

Speed: a context of L tokens is prefilled once (dense), then greedy decode runs under each method
(dense, lychee, quest) on the same runtime; the index is built in a warm-up expansion and timed
apart. Attention time per step is the time in the attention layers (``TreeBatch.attend``, every
layer) plus the step layout (``SparseAttention.prepare``); index time (retrieval, selection,
layout) and sparse attention time (gather, attention, merge) are its two parts.

Fidelity: along dense greedy decoding, every decode step is also run sparse on the same state
(sparse first, then dense, so the dense K/V stay in the pool); top-1 agreement and KL(dense ||
sparse) of the next-token distributions. No compounding: it measures one step's approximation.

Long contexts on a random-weight model of SmolLM2's attention shape are prefilled synthetically:
the K/V of the context are random (runs of 8-32 tokens share a direction, plus noise), written
into the pool through the runtime's own prefill; speed only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from arbor_runtime import LoadedModel, Node, Runtime, SamplingParams
from arbor_runtime.attention.tree import TreeBatch
from arbor_runtime.policies import LycheePolicy, Policy, QuestPolicy
from arbor_runtime.runtime import bind_policy
from arbor_runtime.sparse import SparseAttention, TreeConfig
from arbor_runtime.tasks.data import DataSource, load_rows
from benchmarks.linear import compare

METHODS = ("dense", "lychee", "quest")
#: measured when ``--methods`` names it: lychee with its centroids stored in float16 (no per-node scale), the
#: index before int8 became lychee's default (e6dcb94), for the section's float16-vs-int8 table
VARIANTS = ("lychee-fp16",)
#: few-shot sources: (folder, shot split, file, question field, worked answer field)
SOURCES = {
    "gsm8k": ("gsm8k", "train", "train.jsonl", "question", "answer"),
    "math500": ("math500", "test", "test.jsonl", "problem", "solution"),
}


@dataclass(frozen=True, slots=True)
class SparseSettings:
    """What each sparse method reads (the issue's settings: a fixed 1,024 tokens, 16 sinks; the
    policies' default ``token_share`` is off here so the bench measures a fixed read budget)."""

    token_budget: int = 1024
    sink_tokens: int = 16
    window_tokens: int = 64
    token_share: float = 0.0

    def policy(self, method: str) -> Policy | None:
        """The sparse policy of ``method`` (None for dense)."""
        if method not in METHODS + VARIANTS:
            raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS + VARIANTS)}")
        if method == "dense":
            return None
        cls = {"lychee": LycheePolicy, "lychee-fp16": Float16LycheePolicy}.get(method, QuestPolicy)
        return cls(
            token_budget=self.token_budget,
            sink_tokens=self.sink_tokens,
            window_tokens=self.window_tokens,
            token_share=self.token_share,
            dense_below=0,  # the fixed budget at every context length
        )


@dataclass(slots=True)
class Float16LycheePolicy(LycheePolicy):
    """:class:`LycheePolicy` with float16 centroids (2 bytes a coordinate, no scale) instead of int8 codes
    with a float16 scale per node; everything else (chunks, radii, retrieval) is lychee's."""

    def tree_config(self) -> TreeConfig:
        return replace(LycheePolicy.tree_config(self), dtype=torch.float16)


# ---- contexts -------------------------------------------------------------------------------------
def fewshot_ids(tokenizer, data_dir: str | Path, source: str, length: int) -> list[int]:
    """Exactly ``length`` token ids: worked examples ("Question: ...\\nAnswer: ...") then a new question.

    Shots come from the source's rows 1.., the final question from row 0 of the test split;
    the shots are cut (at the front) so that the whole is ``length`` tokens.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown few-shot source {source!r}; valid: {', '.join(SOURCES)}")
    folder, split, name, q_field, a_field = SOURCES[source]
    shots, _ = load_rows(DataSource(folder, {split: name}), split, data_dir, (q_field, a_field))
    tests, _ = load_rows(DataSource(folder, {"test": "test.jsonl"}), "test", data_dir, (q_field,))
    tail = tokenizer(f"Question: {tests[0][q_field]}\nAnswer:", add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    for row in shots[1:]:
        text = f"Question: {row[q_field]}\nAnswer: {row[a_field]}\n\n"
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) + len(tail) >= length:
            return ids[len(ids) + len(tail) - length :] + tail
    raise ValueError(f"{source}: not enough rows for a {length}-token context")


def synthetic_kv(layers: int, heads: int, tokens: int, dim: int, seed: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Per layer, (1, H, T, D) keys and values: runs of 8-32 tokens share a direction, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 33, (tokens // 8 + 1,), generator=gen)
    run = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)[:tokens]
    for _ in range(layers):
        centers = 3.0 * torch.randn(heads, lengths.numel(), dim, generator=gen)
        keys = centers[:, run] + torch.randn(heads, tokens, dim, generator=gen)
        yield keys.unsqueeze(0), torch.randn(1, heads, tokens, dim, generator=gen)


@contextmanager
def synthetic_prefill(rt: Runtime, seed: int = 0) -> Iterator[None]:
    """Prefills in this block write synthetic K/V instead of running the model (speed benchmarks of
    long contexts); the next-token logits are zeros."""
    backend, shape = rt.backend, rt.backend.shape
    vocab = int(rt.model.config.vocab_size)

    def forward(batch: TreeBatch, input_ids, position_ids, logits_to_keep: int = 1):
        r, q = input_ids.shape
        kv = synthetic_kv(shape.layers, shape.kv_heads, q, shape.head_dim, seed)
        for layer, (k, v) in enumerate(kv):
            batch.update(k.expand(r, -1, -1, -1).to(shape.dtype), v.expand(r, -1, -1, -1).to(shape.dtype), layer)
        return torch.zeros(r, q if logits_to_keep == 0 else logits_to_keep, vocab)

    backend.forward = forward
    try:
        yield
    finally:
        del backend.forward  # the class's forward again


# ---- measurement ------------------------------------------------------------------------------------
def attach(rt: Runtime, policy: Policy | None, through_selection: bool = False) -> SparseAttention | None:
    """Make ``rt``'s decode steps read through ``policy``'s sparse index (None: dense) over the same
    resident KV (the memory policy stays ``rt``'s); its seconds are CPU time of this thread.

    ``through_selection``: a step whose budget covers the context still goes through the index and
    the selection (which then take every chunk), for a benchmark of the sparse path's own cost; by
    default such a step is attended dense, as a user's run attends it."""
    if policy is not None:  # as Runtime binds its policy: dense_layers="auto" becomes the model's layers
        bind_policy(policy, rt.model)
    sparse = None if policy is None else policy.sparse_attention(rt.store, rt.block_token_ids, rt.tokenizer.decode)
    if sparse is not None:
        sparse.clock = time.thread_time
        sparse.dense_when_covered = not through_selection
    rt.backend.sparse = sparse
    return sparse


@contextmanager
def attention_timer() -> Iterator[list[float]]:
    """CPU seconds of this thread in the attention layers (``TreeBatch.attend``), summed into the yielded list."""
    spent = [0.0]
    real = TreeBatch.attend

    def timed(self, *args, **kwargs):
        start = time.thread_time()
        try:
            return real(self, *args, **kwargs)
        finally:
            spent[0] += time.thread_time() - start

    TreeBatch.attend = timed
    try:
        yield spent
    finally:
        TreeBatch.attend = real


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0.0, stop_at_eos=False)


def measure_speed(rt: Runtime, root: Node, method: str, settings: SparseSettings, tokens: int) -> dict[str, Any]:
    """Greedy decode of ``tokens`` under ``method`` from ``root``: tokens per CPU second (and per wall
    second), attention / index CPU time per step. The index is built in a warm-up expansion first."""
    sparse = attach(rt, settings.policy(method), through_selection=True)  # the sparse path's cost at any budget
    rt.release(rt.expand(root, 1, greedy(4))[0])  # warm-up: builds the index
    build = sparse.stats.build_seconds if sparse else 0.0
    if sparse:
        sparse.stats = type(sparse.stats)(index_bytes=sparse.stats.index_bytes,
                                          indexed_kv_bytes=sparse.stats.indexed_kv_bytes)  # fmt: skip
    calls = rt.backend.forward_calls
    with attention_timer() as spent:
        wall, cpu = time.perf_counter(), time.process_time()
        child = rt.expand(root, 1, greedy(tokens))[0]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    steps = rt.backend.forward_calls - calls
    rt.release(child)
    attach(rt, None)
    s = sparse.stats if sparse else None
    prepare = 0.0 if s is None else s.layout_seconds  # spent outside the attention layers
    return {
        "method": method,
        "decode_tokens": len(child.token_ids),
        "decode_tok_s": len(child.token_ids) / cpu,
        "decode_tok_s_wall": len(child.token_ids) / wall,
        "attn_ms_step": 1000 * (spent[0] + prepare) / steps,
        "index_ms_step": None if s is None else 1000 * s.index_seconds / steps,
        "sparse_attn_ms_step": None if s is None else 1000 * s.attention_seconds / steps,
        "build_s": build,
        "read_fraction": 1.0 if s is None else s.read_fraction,
        "index_mb": 0.0 if s is None else s.index_bytes / 2**20,
        "index_pct": 0.0 if s is None else 100 * s.index_ratio,
    }


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The field-wise median of repeated measurements of one method (None stays None)."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in rows)
    return out | {"repeats": len(rows)}


def measure_fidelity(rt: Runtime, root: Node, method: str, settings: SparseSettings, steps: int) -> dict[str, Any]:
    """Top-1 agreement and KL(dense || sparse) of each decode step along dense greedy decoding."""
    sparse, backend = settings.policy(method), rt.backend
    index = attach(rt, sparse, through_selection=True)
    backend.sparse = None
    real = backend.forward
    agree, kls = [], []

    def paired(batch: TreeBatch, input_ids, position_ids, logits_to_keep: int = 1):
        if batch.own_slots is None:
            return real(batch, input_ids, position_ids, logits_to_keep)
        backend.sparse = index
        approx = real(batch, input_ids, position_ids, logits_to_keep)  # sparse first: dense K/V stay
        backend.sparse, batch.sparse = None, None
        exact = real(batch, input_ids, position_ids, logits_to_keep)
        p, q = torch.log_softmax(exact[:, -1].float(), -1), torch.log_softmax(approx[:, -1].float(), -1)
        kl, top1 = compare(p, q)
        kls.extend(kl)
        agree.extend(float(x) for x in top1)
        return exact

    backend.forward = paired
    try:
        rt.release(rt.expand(root, 1, greedy(steps + 1))[0])
    finally:
        del backend.forward
        attach(rt, None)
    return {"method": method, "steps": len(kls), "top1": sum(agree) / len(agree), "kl": sum(kls) / len(kls),
            "max_kl": max(kls)}  # fmt: skip


def prefilled(loaded: LoadedModel, ids: list[int], synthetic: bool) -> tuple[Runtime, Node, float]:
    """A runtime under ``full`` with a root of ``ids``; returns it, the root and the prefill seconds."""
    rt = Runtime(loaded, policy="full")
    start = time.perf_counter()
    if synthetic:
        with synthetic_prefill(rt):
            root = rt.new_tree_ids(ids)
    else:
        root = rt.new_tree_ids(ids)
    return rt, root, time.perf_counter() - start
