"""``rerank`` (issue 49): the chunk index picks candidates, the candidates' keys are scored exactly and
the read budget's best keys are read.

Candidates covering the context make it the exact top-k oracle (same tokens and logprobs as
``oracle_topk``); at any factor every row and KV head reads its forced keys and at most the budget
more, the best of its candidates by max over the group's query heads of q.k (a brute-force
reference); the read is the budget's whether or not it reranks; bad factors are refused by name.
"""

from __future__ import annotations

import pytest
import torch
from test_sparse_attention import grow  # the same tree the sparse policies are tested on

from arbor_runtime import Runtime
from arbor_runtime.policies import LycheePolicy, OracleTopKPolicy, QuestPolicy
from arbor_runtime.sparse.step import SparseStep, gather_heads, pack, top_keys

SPARSE = {"lychee": LycheePolicy, "quest": QuestPolicy}


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def small(cls, **knobs):
    """A sparse policy reading 120 of the tiny tree's ~450-token contexts: past the ~80 forced (sinks and
    window), short of the whole (children indexed too)."""
    return cls(**({"token_budget": 120, "token_share": 0.0, "dense_below": 0, "min_block_tokens": 4} | knobs))


@pytest.mark.parametrize("memory", ["full", "h2o"])  # h2o: the attention path that collects statistics
def test_candidates_covering_the_context_read_what_the_oracle_reads(tiny, memory):
    oracle = grow(Runtime(tiny, policy=small(OracleTopKPolicy, memory=memory)))
    one = {"min_chunk_tokens": 1, "max_chunk_tokens": 1}  # one-token chunks: the same forced keys as the oracle
    rt = Runtime(tiny, policy=small(LycheePolicy, memory=memory, rerank=64.0, **one))
    reranked = grow(rt)
    stats = rt.backend.sparse.stats
    assert stats.steps > stats.dense_steps and 0 < stats.read_fraction < 1
    assert stats.scored_tokens > 0
    for a, b in zip(oracle, reranked, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_reading_every_candidate_equals_dense_attention(tiny, name):
    dense = grow(Runtime(tiny, policy="full"))
    rt = Runtime(tiny, policy=small(SPARSE[name], token_budget=10**6, rerank=2.0))
    rt.backend.sparse.dense_when_covered = False  # through the selection and the token cut
    sparse = grow(rt)
    assert rt.backend.sparse.stats.dense_steps == 0 and rt.backend.sparse.stats.read_fraction == 1.0
    for a, b in zip(dense, sparse, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def cuts(rt: Runtime, monkeypatch) -> list[tuple]:
    """Every token cut while :func:`grow` runs: (step, layer, q, slots, valid, forced, own, pick, keep)."""
    seen = []
    rerank = SparseStep._rerank

    def spy(self, layer, q, slots, valid, forced, scale, own=0):
        got = rerank(self, layer, q, slots, valid, forced, scale, own)
        seen.append((self, layer, q.clone(), slots, valid, forced, own, got[2], got[3]))
        return got

    monkeypatch.setattr(SparseStep, "_rerank", spy)
    grow(rt)
    return seen


@pytest.mark.parametrize("name", sorted(SPARSE))
@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_the_cut_keeps_the_forced_keys_and_the_budgets_best_candidates(tiny, monkeypatch, name, factor):
    budget = 120
    rt = Runtime(tiny, policy=small(SPARSE[name], token_budget=budget, rerank=factor))
    seen = cuts(rt, monkeypatch)
    assert seen
    wider = 0
    for step, layer, q, slots, valid, forced, own, pick, keep in seen:
        (keys,) = gather_heads(step.batch.pool, layer, slots.clamp(min=0), step.batch.groups, ("keys",))
        rank = torch.einsum("rhgd,rhsd->rhgs", q, keys.float()).amax(2)  # (R, H, S + own)
        s = slots.shape[-1] - own
        for r in range(slots.shape[0]):
            for h in range(slots.shape[1]):
                real = valid[r, h, :s]
                must = set(torch.nonzero(real & forced[r, h]).flatten().tolist())
                mine = set(torch.nonzero(valid[r, h, s:]).flatten().add(s).tolist())  # the row's own tokens
                read = set(pick[r, h][keep[r, h]].tolist())
                assert must | mine <= read  # forced and own keys are always read
                free = torch.nonzero(real & ~forced[r, h]).flatten().tolist()
                wider += len(free) > budget
                best = sorted(free, key=lambda i: -float(rank[r, h, i]))[: max(budget - len(must), 0)]
                others = read - must - mine
                assert len(others) == len(best)  # the budget, in all (forced ones included)
                if best:  # the same keys up to ties at the cut
                    floor = float(rank[r, h, best[-1]])
                    assert all(float(rank[r, h, i]) >= floor - 1e-5 for i in others)
    if factor > 1:
        assert wider  # some cut chose among more candidates than it read


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_the_read_is_the_budgets_whether_or_not_it_reranks(tiny, name):
    fractions = []
    for factor in (0.0, 2.0):
        rt = Runtime(tiny, policy=small(SPARSE[name], rerank=factor))
        grow(rt)
        stats = rt.backend.sparse.stats
        fractions.append(stats.read_fraction)
        assert (stats.scored_tokens > 0) == (factor > 0)
    plain, reranked = fractions
    assert 0 < reranked < 1 and abs(plain - reranked) < 0.05 * plain


@pytest.mark.parametrize("name", sorted(SPARSE))
@pytest.mark.parametrize("bad", [0.5, -1, True, "2"])
def test_a_bad_factor_is_refused_by_name(name, bad):
    with pytest.raises(ValueError, match=f"rerank={bad!r} must be 0 \\(off\\) or a number in \\[1, 64\\]"):
        SPARSE[name](rerank=bad)


def test_pack_puts_the_kept_places_first_in_order():
    keep = torch.rand(2, 3, 50, generator=torch.Generator().manual_seed(0)) > 0.4
    keep[1, 2] = False  # a row and head with nothing kept
    at, real = pack(keep)
    assert at.shape[-1] == int(keep.sum(-1).max()) and real.sum() == keep.sum()
    for r in range(2):
        for h in range(3):
            assert at[r, h][real[r, h]].tolist() == torch.nonzero(keep[r, h]).flatten().tolist()


def test_the_cut_keeps_every_forced_key_even_past_the_budget():
    inf = float("inf")
    rank = torch.tensor([[[inf, 0.5, inf, 0.9, inf, -inf, 0.1]], [[0.3, inf, 0.2, 0.7, -inf, 0.8, 0.0]]])
    top, pick = top_keys(rank, reads=2)  # row 0 has 3 forced keys: all read, nothing else
    read = [sorted(p[t > float("-inf")].tolist()) for t, p in zip(top[:, 0], pick[:, 0], strict=True)]
    assert read == [[0, 2, 4], [1, 5]]  # row 1: its forced key and its best other
    top, pick = top_keys(rank, reads=4)
    read = [sorted(p[t > float("-inf")].tolist()) for t, p in zip(top[:, 0], pick[:, 0], strict=True)]
    assert read == [[0, 2, 3, 4], [0, 1, 3, 5]]


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_dense_layers_stay_dense_under_the_token_cut(tiny, name):
    """Every chunk of a dense layer is scored +inf: the cut reads all of it (the tiny model has 2 layers)."""
    dense = grow(Runtime(tiny, policy="full"))
    rt = Runtime(tiny, policy=small(SPARSE[name], dense_layers=2, rerank=2.0))
    sparse = grow(rt)
    assert rt.backend.sparse.stats.dense_steps == 0 and rt.backend.sparse.stats.read_fraction == 1.0
    for a, b in zip(dense, sparse, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
