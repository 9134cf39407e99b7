"""The flat-pool scorer policies (h2o, streaming, snapkv, kvp) and thinkv plan exactly what they
planned before the ScorerPolicy base existed.

The references below are frozen copies of each policy's ``plan`` as it was (issue 22, main at
e0b0118); every policy is compared with its reference on random memory views: partly evicted
blocks, attention records with many ties, targets from 0 past the resident count. The reference
runs on the same machine as the policy, so float details of a platform (KVP scores, pooling) are
shared by both sides.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from arbor_runtime.kv import BlockKV, Extent
from arbor_runtime.kv.block import Segment
from arbor_runtime.policies import H2OPolicy, KVPPolicy, SnapKVPolicy, StreamingPolicy, ThinKVPolicy
from arbor_runtime.policies.allocation import fit_floors, flat_pool, plan_from_mask, top_tokens, water_fill
from arbor_runtime.policies.base import BlockView, MemoryView, RetentionPlan
from arbor_runtime.policies.kvp import KVPScores
from arbor_runtime.policies.kvp_scorer import KVPScorer, ScorerShape
from arbor_runtime.tree import PROMPT, Node

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KVP_SHAPE = ScorerShape(layers=2, kv_heads=2, head_dim=8, embed=8, hidden=8)


# ---- frozen references: today's plans ---------------------------------------------------------
def ref_h2o(p: H2OPolicy, view: MemoryView) -> RetentionPlan | None:
    pos, tok, att = flat_pool(view.blocks)
    cap = max(view.target, 0)
    if tok.numel() <= cap:
        return None
    n_recent = round(cap * p.recent_ratio / (p.heavy_ratio + p.recent_ratio))
    keep = torch.zeros(tok.numel(), dtype=torch.bool)
    if n_recent:
        keep[-n_recent:] = True
    n_heavy = cap - n_recent
    if n_heavy > 0:
        scores = att.clone().float().masked_fill(keep, float("-inf"))
        keep[torch.topk(scores, n_heavy).indices] = True
    return RetentionPlan(keep=plan_from_mask(view.blocks, pos, tok, keep))


def ref_streaming(p: StreamingPolicy, view: MemoryView) -> RetentionPlan | None:
    pos, tok, _ = flat_pool(view.blocks)
    cap = max(view.target, 0)
    if tok.numel() <= cap:
        return None
    keep = torch.zeros(tok.numel(), dtype=torch.bool)
    sinks = min(p.sink_tokens, cap)
    keep[:sinks] = True
    if cap - sinks > 0:
        keep[-(cap - sinks) :] = True
    return RetentionPlan(keep=plan_from_mask(view.blocks, pos, tok, keep))


def ref_snapkv_pooled(p: SnapKVPolicy, kv, protected: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    kept = kept.cpu()
    scores = torch.zeros(kv.length)
    scores[kept] = kv.attention[kept].float()
    scores[kept[protected]] = 0.0
    pad = p.kernel_size // 2
    row = scores.view(1, 1, -1)
    if p.pooling == "avg":
        pooled = F.avg_pool1d(row, p.kernel_size, stride=1, padding=pad)
    else:
        pooled = F.max_pool1d(row, p.kernel_size, stride=1, padding=pad)
    return pooled.view(-1)[kept]


def ref_snapkv(p: SnapKVPolicy, view: MemoryView) -> RetentionPlan | None:
    pos, tok, _ = flat_pool(view.blocks)
    cap = max(view.target, 0)
    if tok.numel() <= cap:
        return None
    keep = torch.zeros(tok.numel(), dtype=torch.bool)
    n_recent = min(p.window_size, cap)
    if n_recent:
        keep[-n_recent:] = True
    n_more = cap - n_recent
    if n_more > 0:
        scores = torch.cat([ref_snapkv_pooled(p, b.kv, keep[pos == i], b.kv.kept) for i, b in enumerate(view.blocks)])
        keep[torch.topk(scores.masked_fill(keep, float("-inf")), n_more).indices] = True
    return RetentionPlan(keep=plan_from_mask(view.blocks, pos, tok, keep))


def ref_kvp(p: KVPPolicy, scores_of: KVPScores, view: MemoryView) -> RetentionPlan | None:
    pos, tok, _ = flat_pool(view.blocks)
    cap = max(view.target, 0)
    if tok.numel() <= cap:
        return None
    scores = scores_of.token_scores(view)
    keep = torch.zeros(tok.numel(), dtype=torch.bool)
    keep[: min(p.sink_tokens, cap)] = True
    n_recent = min(int(cap * p.recent_ratio), cap - int(keep.sum()))
    if n_recent > 0:
        keep[tok.numel() - n_recent :] = True
    n_more = cap - int(keep.sum())
    if n_more > 0:
        keep[torch.topk(scores.masked_fill(keep, float("-inf")), n_more).indices] = True
    return RetentionPlan(keep=plan_from_mask(view.blocks, pos, tok, keep))


def ref_thinkv(p: ThinKVPolicy, view: MemoryView) -> RetentionPlan | None:
    blocks = view.blocks
    sizes = [b.kv.kept_tokens for b in blocks]
    if sum(sizes) <= view.target:
        return None
    importance = [float(b.kv.attention[b.kv.kept.cpu()].mean()) if b.kv.kept_tokens else 0.0 for b in blocks]
    top = max(importance + [1e-9])
    weights = [max(i / top, 1e-3) for i in importance]
    capacity = max(view.target, 0)
    floors = fit_floors([min(p.min_tokens_per_block, s) for s in sizes], weights, capacity)
    alloc = water_fill(sizes, floors, weights, capacity)
    plan = RetentionPlan()
    for b, n, size, floor in zip(blocks, alloc, sizes, floors, strict=True):
        if n < size:
            plan.keep[b.node.id] = top_tokens(b.kv.kept, b.kv.attention, b.kv.kept[:floor], n)
    return plan


# ---- random views -----------------------------------------------------------------------------
def random_view(seed: int, target: int | None = None) -> MemoryView:
    """1-5 blocks (a chain) of 1-70 tokens, some partly evicted (kept tokens split over segments
    in any order); attention quantised to quarters so that ties are common (some blocks all 0).
    The view's ``read`` serves fixed random K/V (for KVP)."""
    gen = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    blocks, kvs, parent, start, slot = [], {}, None, 0, 0
    for i in range(randint(1, 5)):
        n = randint(1, 70)
        node = Node(id=10 + i, parent=parent, token_ids=[5] * n, text="", kind=PROMPT, start_pos=start)
        kv = BlockKV.from_extents([Extent(slot, n)], start, None)
        kind = randint(0, 3)
        if kind == 0:
            kv.attention = torch.zeros(n)
        else:
            kv.attention = torch.round(torch.rand(n, generator=gen) * 4 * kind) / 4
        if n > 2 and randint(0, 1):  # partly evicted: a random subset, in two segments out of order
            kept = torch.sort(torch.randperm(n, generator=gen)[: randint(1, n - 1)]).values
            half = kept.numel() // 2
            kv.set_segments([Segment(slot + half, kept[half:]), Segment(slot, kept[:half])])
        kvs[node.id] = (
            torch.randn(KVP_SHAPE.layers, KVP_SHAPE.kv_heads, n, KVP_SHAPE.head_dim, generator=gen),
            torch.randn(KVP_SHAPE.layers, KVP_SHAPE.kv_heads, n, KVP_SHAPE.head_dim, generator=gen),
        )
        blocks.append(BlockView(node, kv, active=bool(randint(0, 1))))
        parent, start, slot = node, start + n, slot + n

    def read(block_id: int, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = kvs[block_id]
        return k[:, :, tokens], v[:, :, tokens]

    resident = sum(b.kv.kept_tokens for b in blocks)
    if target is None:
        target = randint(-2, resident + 3)
    return MemoryView(blocks=blocks, active=frozenset(), budget=None, target=target, read=read)


def targets(seed: int) -> list[int]:
    view = random_view(seed, 0)
    r = view.resident
    return sorted({-1, 0, 1, 2, 3, 5, r // 4, r // 2, r - 1, r, r + 4})


def same_plan(a: RetentionPlan | None, b: RetentionPlan | None) -> None:
    if a is None or b is None:
        assert a is None and b is None, (a, b)
        return
    assert sorted(a.keep) == sorted(b.keep) and a.drop_host == b.drop_host
    for block_id, idx in a.keep.items():
        assert idx.dtype == b.keep[block_id].dtype and idx.tolist() == b.keep[block_id].tolist(), block_id


SEEDS = range(16)

H2O = [
    {},
    {"heavy_ratio": 3, "recent_ratio": 1},
    {"heavy_ratio": 0, "recent_ratio": 1},
    {"heavy_ratio": 1, "recent_ratio": 0},
]
STREAMING = [{}, {"sink_tokens": 0}, {"sink_tokens": 1}, {"sink_tokens": 100}]
SNAPKV = [
    {},
    {"window_size": 8, "kernel_size": 3, "pooling": "max"},
    {"window_size": 4, "kernel_size": 1},
    {"window_size": 1, "kernel_size": 7},
]
KVP = [{}, {"sink_tokens": 3, "recent_ratio": 0.25}, {"recent_ratio": 0}, {"sink_tokens": 200, "recent_ratio": 0.9}]


@pytest.mark.parametrize("seed", SEEDS)
def test_h2o_streaming_snapkv_thinkv_plan_as_before(seed):
    checked = 0
    for target in targets(seed):
        view = random_view(seed, target)
        for kw in H2O:
            same_plan(H2OPolicy(**kw).plan(view), ref_h2o(H2OPolicy(**kw), view))
        for kw in STREAMING:
            same_plan(StreamingPolicy(**kw).plan(view), ref_streaming(StreamingPolicy(**kw), view))
        for kw in SNAPKV:
            same_plan(SnapKVPolicy(**kw).plan(view), ref_snapkv(SnapKVPolicy(**kw), view))
        for kw in ({}, {"min_tokens_per_block": 4}):
            same_plan(ThinKVPolicy(**kw).plan(view), ref_thinkv(ThinKVPolicy(**kw), view))
        checked += view.resident > max(target, 0)
    assert checked  # some targets asked for evictions


def bound_kvp(**kw) -> KVPPolicy:
    policy = KVPPolicy(**kw)
    policy.scores.scorer = KVPScorer(KVP_SHAPE, seed=7)
    return policy


@pytest.mark.parametrize("seed", SEEDS)
def test_kvp_plans_and_scores_as_before(seed):
    for kw in KVP:
        policy, ref_policy = bound_kvp(**kw), bound_kvp(**kw)
        for target in targets(seed):
            view = random_view(seed, target)
            same_plan(policy.plan(view), ref_kvp(ref_policy, ref_policy.scores, view))
            # the same tokens were scored (each once: a second plan on the view scores nothing new)
            assert policy.scores.scored_tokens == ref_policy.scores.scored_tokens
        assert policy.scores.scored_tokens <= random_view(seed, 0).resident


def test_a_tie_is_broken_the_same_way_and_plans_keep_exactly_the_target():
    """All-zero attention: every token ties; the plans still keep exactly ``target`` tokens."""
    record = torch.zeros(50)
    node = Node(id=0, parent=None, token_ids=[5] * 50, text="", kind=PROMPT, start_pos=0)
    kv = BlockKV.from_extents([Extent(0, 50)], 0, None)
    kv.attention = record
    view = MemoryView(blocks=[BlockView(node, kv, active=True)], active=frozenset(), budget=None, target=12)
    for policy, ref in [
        (H2OPolicy(), ref_h2o),
        (StreamingPolicy(), ref_streaming),
        (SnapKVPolicy(window_size=4), ref_snapkv),
    ]:
        plan = policy.plan(view)
        same_plan(plan, ref(policy, view))
        assert plan.keep[0].numel() == 12
    assert StreamingPolicy().plan(view).keep[0].tolist() == [0, 1, 2, 3, *range(42, 50)]
