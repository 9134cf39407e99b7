"""Issue 49: lychee's ``chunk_score=axis``: a chunk scored by its centroid plus the spread of its keys
along their principal axis, q.c + max(q.u hi, q.u lo).

- exact (the chunk's best key) when a chunk's keys deviate from c along one direction, never below the
  centroid score, never above the bound (so the hierarchy's descent stays exact for it);
- a lone key aligned with the query lifts its chunk above chunks of uniformly moderate keys, where the
  centroid averages it away;
- lazy updates give the scores a fresh build gives; the knob reaches the index and is validated; with
  the whole context in budget the runtime's tokens are dense attention's.
"""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import LycheePolicy
from arbor_runtime.sparse import ChunkTree, TreeConfig
from arbor_runtime.sparse.tree import bound

CHUNK, DIM = 8, 16
PROMPT = " ".join(f"Line {i} says the value is {i * 7 % 13}." for i in range(40)) + "\nAnswer:"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def build(keys: torch.Tensor, score: str, dtype=torch.float32, **knobs) -> ChunkTree:
    """An index of fixed CHUNK-token chunks over keys (L, H, T, D), scanned flat unless knobs say."""
    t = keys.shape[2]
    knobs = {"flat_chunks": 1 << 20} | knobs
    cfg = TreeConfig(min_len=CHUNK, max_len=CHUNK, radius_scale=0.0, score=score, dtype=dtype, **knobs)
    return ChunkTree.build(cfg, lambda layer, tok: keys[layer][:, tok], keys.shape[0], torch.arange(t), no_ends(t))


def no_ends(t: int) -> torch.Tensor:
    return torch.zeros(t, dtype=torch.bool)


def chunk_best(keys: torch.Tensor, layer: int, q: torch.Tensor) -> torch.Tensor:
    """(r, H, C) max over each chunk's keys and a group's query heads of q . k (fixed CHUNK chunks)."""
    qk = torch.einsum("rhgd,htd->rhgt", q, keys[layer]).amax(2)
    return qk.view(*qk.shape[:2], -1, CHUNK).amax(-1)


def rank_one_keys(chunks: int, seed: int) -> torch.Tensor:
    """(1, 2, chunks x CHUNK, DIM): each chunk's keys are its centre plus a multiple of its own direction."""
    gen = torch.Generator().manual_seed(seed)
    centre = torch.randn(1, 2, chunks, DIM, generator=gen).repeat_interleave(CHUNK, dim=2)
    direction = torch.randn(1, 2, chunks, DIM, generator=gen).repeat_interleave(CHUNK, dim=2)
    return centre + torch.randn(1, 2, chunks * CHUNK, 1, generator=gen) * direction


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_a_chunk_whose_keys_lie_on_a_line_scores_its_best_key(dtype):
    keys = rank_one_keys(30, 0)
    q = torch.randn(4, 2, 3, DIM, generator=torch.Generator().manual_seed(1))
    got = build(keys, "axis", dtype).scores(0, q)
    tol = 1e-4 if dtype == torch.float32 else 0.1  # int8 axes and centroids (+ float16 spans) round
    torch.testing.assert_close(got, chunk_best(keys, 0, q), atol=tol * float(q.norm(dim=-1).max()), rtol=0)
    centroid = build(keys, "centroid", dtype).scores(0, q)
    assert float((chunk_best(keys, 0, q) - centroid).max()) > 1.0  # the centroid alone misses by far


def test_the_axis_score_lies_between_the_centroid_score_and_the_bound():
    gen = torch.Generator().manual_seed(2)
    keys = torch.randn(2, 3, 40 * CHUNK, DIM, generator=gen)
    q = torch.randn(5, 3, 2, DIM, generator=gen)
    tree = build(keys, "axis", torch.int8)
    for layer in range(2):
        leaves = tree.levels[0]
        axis = tree.scores(layer, q)
        centroid = torch.matmul(q, leaves.centers(layer).transpose(-1, -2)).amax(2)
        assert bool((axis >= centroid - 1e-5).all())
        assert bool((axis <= bound(leaves, layer, q, None, 1.0) + 1e-3).all())


def test_a_lone_key_along_the_query_lifts_its_chunk_above_uniformly_moderate_chunks():
    """The needle chunk: seven small keys and one key 4 q; twenty decoy chunks: every key q + noise.
    Centroid: the needle scores about 0.5 against the decoys' 1. Axis: about 4 against 1."""
    gen = torch.Generator().manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(DIM, generator=gen), dim=0)
    keys = 0.05 * torch.randn(1, 1, 40 * CHUNK, DIM, generator=gen)
    decoys = list(range(10, 30))
    for c in decoys:
        keys[0, 0, c * CHUNK : (c + 1) * CHUNK] += q
    needle = 35
    keys[0, 0, needle * CHUNK + 3] += 4 * q
    query = q.view(1, 1, 1, DIM)
    by_centroid = build(keys, "centroid", torch.int8).scores(0, query)[0, 0]
    assert int((by_centroid > by_centroid[needle]).sum()) >= len(decoys)
    ids, _ = build(keys, "axis", torch.int8).retrieve(0, query, 1)
    assert int(ids[0, 0, 0]) == needle


def test_exact_descent_returns_the_top_chunks_by_the_axis_score():
    gen = torch.Generator().manual_seed(4)
    keys = torch.randn(1, 2, 300 * CHUNK, DIM, generator=gen)
    tree = build(keys, "axis", torch.int8, fanout=4, top_nodes=8, flat_chunks=0)
    assert len(tree.levels) > 2
    q = torch.randn(3, 2, 2, DIM, generator=gen)
    want = tree.leaf_bounds(0, q).topk(12, dim=-1).values
    _, got = tree.retrieve(0, q, 12, exact=True)
    torch.testing.assert_close(got.sort(-1, descending=True).values, want)


def test_a_grown_block_scores_as_a_fresh_build_of_it():
    gen = torch.Generator().manual_seed(5)
    keys = torch.randn(2, 2, 50 * CHUNK, DIM, generator=gen)
    t = keys.shape[2]
    cfg = TreeConfig(min_len=CHUNK, max_len=CHUNK, score="axis", flat_chunks=1 << 20)
    read = lambda layer, tok: keys[layer][:, tok]  # noqa: E731
    tree = ChunkTree.build(cfg, read, 2, torch.arange(t // 2 + 3), no_ends(t // 2 + 3))
    assert tree.update(read, 2, torch.arange(t), no_ends(t))
    fresh = ChunkTree.build(cfg, read, 2, torch.arange(t), no_ends(t))
    q = torch.randn(2, 2, 3, DIM, generator=gen)
    for layer in range(2):
        torch.testing.assert_close(tree.scores(layer, q), fresh.scores(layer, q))
    assert tree.nbytes == fresh.nbytes > build(keys, "centroid", torch.int8).nbytes


def test_the_chunk_score_knob_reaches_the_index_and_bad_values_name_it():
    assert LycheePolicy().chunk_score == "centroid"
    assert LycheePolicy(chunk_score="axis").tree_config().score == "axis"
    with pytest.raises(ValueError, match="chunk_score='max': how a chunk is scored; valid: centroid, axis"):
        LycheePolicy(chunk_score="max")


def grow(rt: Runtime):
    root = rt.new_tree(PROMPT, seed=3)
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=6, temperature=1.0))
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    return kids + [c for got in rt.expand_many([(k, 1) for k in kids], greedy) for c in got]


def test_with_everything_in_budget_the_axis_score_decodes_as_dense_and_a_small_budget_repeats(tiny):
    dense = grow(Runtime(tiny, policy="full"))
    runs = []
    for budget in (10**6, 24, 24):
        policy = LycheePolicy(
            token_budget=budget, token_share=0.0, dense_below=0, min_block_tokens=4, chunk_score="axis"
        )
        rt = Runtime(tiny, policy=policy)
        runs.append([(n.token_ids, n.logprobs) for n in grow(rt)])
        if budget == 24:
            assert rt.backend.sparse.stats.read_fraction < 0.9
    for (ids, logp), d in zip(runs[0], dense, strict=True):
        assert ids == d.token_ids
        assert max(abs(x - y) for x, y in zip(logp, d.logprobs, strict=True)) < 1e-4
    assert runs[1] == runs[2]
