"""Sparse decode attention in the runtime (policy=lychee / quest) on the tiny random Llama.

Reading every chunk is dense attention; sinks and the recent window are always read; a sparse
policy composes with the memory policy it wraps; the index is counted in the budget and reported.
"""

from __future__ import annotations

import copy

import pytest
import torch

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import H2OPolicy, LycheePolicy, QuestPolicy, build_policy
from arbor_runtime.sparse.step import SparseStep

PROMPT = " ".join(f"Line {i} says the value is {i * 7 % 13}." for i in range(40)) + "\nAnswer:"
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)
SPARSE = {"lychee": LycheePolicy, "quest": QuestPolicy}


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def grow(rt: Runtime, params: SamplingParams = GREEDY):
    """A prompt, two sampled children, a greedy grandchild under each: rows share context blocks."""
    root = rt.new_tree(PROMPT, seed=3)
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=6, temperature=1.0))
    return kids + [c for got in rt.expand_many([(k, 1) for k in kids], params) for c in got]


@pytest.mark.parametrize("name", sorted(SPARSE))
@pytest.mark.parametrize("memory", ["full", "h2o", "snapkv", "kvp"])  # h2o: statistics from the sparse path
def test_reading_every_chunk_equals_dense_attention(tiny, name, memory):
    dense = grow(Runtime(tiny, policy=memory))
    policy = SPARSE[name](memory=memory, token_budget=10**6, min_block_tokens=4)  # children indexed too
    rt = Runtime(tiny, policy=policy)
    rt.backend.sparse.dense_when_covered = False  # through the selection, which takes every chunk
    sparse = grow(rt)
    assert rt.backend.sparse.stats.steps > 0 and rt.backend.sparse.stats.dense_steps == 0
    assert rt.backend.sparse.stats.builds == 3  # the prompt and both children (each read by one row only)
    assert rt.backend.sparse.stats.read_fraction == 1.0
    for a, b in zip(dense, sparse, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_a_budget_covering_the_context_is_a_dense_step(tiny, name):
    """With the budget above every row's resident context the step skips the selection: no index is
    built, the step is counted dense, and the tokens and log-probs are dense attention's exactly."""
    dense = grow(Runtime(tiny, policy="full"))
    rt = Runtime(tiny, policy=SPARSE[name](token_budget=10**6, min_block_tokens=4))
    sparse = grow(rt)
    stats = rt.backend.sparse.stats
    assert stats.steps > 0 and stats.dense_steps == stats.steps and stats.builds == 0
    assert stats.read_fraction == 1.0 and stats.read_tokens > 0
    for a, b in zip(dense, sparse, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def read_positions(step: SparseStep, chosen: torch.Tensor, take: torch.Tensor) -> list[list[set[int]]]:
    """Per row and KV head, the position ids of the context tokens a layer read."""
    where: dict[int, int] = {}  # pool slot -> position
    for grp in step.batch.groups:
        start_pos = step.owner.store.get(grp.block_id).start_pos
        for p in grp.pieces:
            for i, tok in enumerate(p.idx.tolist()):
                where[p.start + i] = start_pos + tok
    slots = step.slots[chosen].masked_fill(~take.unsqueeze(-1), -1)  # (R, H, K, W)
    return [[{where[s] for s in head.flatten().tolist() if s >= 0} for head in row] for row in slots]


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_sinks_and_window_are_always_read_and_the_budget_holds(tiny, name, monkeypatch):
    policy = SPARSE[name](
        token_budget=48,
        sink_tokens=16,
        window_tokens=16,
        min_block_tokens=4,
        token_share=0.0,
        dense_below=0,
        dense_layers=0,
    )
    rt = Runtime(tiny, policy=policy)
    seen = []
    select = SparseStep._select

    def spy(self, layer, qg):
        chosen, take = select(self, layer, qg)
        seen.append((self, read_positions(self, chosen, take)))
        return chosen, take

    monkeypatch.setattr(SparseStep, "_select", spy)
    leaves = grow(rt)
    assert seen and rt.backend.sparse.stats.read_fraction < 0.2
    context = {len(rt.path_token_ids(leaf)) - len(leaf.token_ids) for leaf in leaves}
    for step, rows in seen:
        for r, heads in enumerate(rows):
            row_context = int(step.context[r])  # resident context tokens of the row (all, under full)
            assert row_context >= min(context)
            pos = row_context + int(step.batch.own_valid[r].sum()) - 1  # the query's position
            must = set(range(16)) | set(range(pos - 16, row_context))  # the window counts own tokens too
            for read in heads:
                assert must <= read, sorted(must - read)
                assert len(read) < 48 + policy.index_builder()[1]  # the budget, plus at most one chunk


def test_lychee_composes_with_a_memory_policy_under_a_budget(tiny):
    """lychee over h2o at a budget that forces evictions, reading every chunk, generates what h2o
    generates with the same pool; retrieval runs over the resident tokens (partly evicted blocks)."""
    policy = LycheePolicy(memory="h2o", budget_tokens=420, token_budget=10**6, min_block_tokens=8)
    rt = Runtime(tiny, policy=policy)
    assert rt.store.pool.capacity == policy.kv_budget_tokens == 420 - policy.reserve_tokens
    sparse = grow(rt)
    dense_rt = Runtime(tiny, policy=H2OPolicy(budget_tokens=policy.kv_budget_tokens))
    dense = grow(dense_rt)
    assert rt.metrics.evicted_tokens > 0 and rt.metrics.evicted_tokens == dense_rt.metrics.evicted_tokens
    assert [n.token_ids for n in sparse] == [n.token_ids for n in dense]
    stats = rt.backend.sparse.stats
    assert stats.steps > 0 and stats.index_bytes <= policy.reserve_tokens * rt.backend.shape.bytes_per_token


def test_index_memory_is_counted_in_the_budget_and_reported(tiny):
    policy = build_policy(
        "lychee",
        budget_tokens=2000,
        min_block_tokens=8,
        token_budget=64,
        token_share=0.0,
        dense_below=0,
        dense_layers=0,
    )
    rt = Runtime(tiny, policy=policy)
    grow(rt)
    m = rt.metrics.to_dict()
    assert rt.store.pool.capacity == 2000 - 100  # lychee's 5% reserved for the index
    assert 0 < m["peak_index_bytes"] <= 100 * rt.backend.shape.bytes_per_token
    assert 0 < m["index_kv_ratio"] < 0.05
    assert m["index_seconds"] > 0 and m["sparse_attention_seconds"] > 0 and m["sparse_read_fraction"] < 1


def test_sparse_policy_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="memory='lru' is not a memory policy; valid: full, h2o"):
        LycheePolicy(memory="lru")
    with pytest.raises(ValueError, match="memory='quest' is a sparse policy"):
        LycheePolicy(memory=QuestPolicy())
    with pytest.raises(ValueError, match="token_budget=0 must be an integer >= 1"):
        QuestPolicy(token_budget=0)
    with pytest.raises(ValueError, match="page_tokens=0"):
        QuestPolicy(page_tokens=0)
    with pytest.raises(ValueError, match="min_len <= max_len"):
        LycheePolicy(min_chunk_tokens=20, max_chunk_tokens=16)
    with pytest.raises(ValueError, match="index_reserve=0.7"):
        LycheePolicy(index_reserve=0.7)


def test_a_copied_runtime_indexes_its_own_blocks(tiny):
    rt = Runtime(tiny, policy=LycheePolicy(min_block_tokens=8, token_budget=32))
    rt.new_tree(PROMPT)
    clone = copy.deepcopy(rt, {id(tiny.model): tiny.model, id(tiny.tokenizer): tiny.tokenizer})
    sparse = clone.backend.sparse
    assert sparse.store is clone.store and sparse.token_ids.__self__ is clone
    assert rt.backend.sparse.token_ids.__self__ is rt


def test_sparse_indexes_refuse_a_device_model_with_a_clear_error():
    class Shape:
        device = torch.device("cuda", 0)

    class Store:
        shape = Shape()

    with pytest.raises(NotImplementedError, match="policy=lychee: sparse indexes need a CPU model, not cuda:0"):
        LycheePolicy().sparse_attention(Store(), lambda i: [], None)
