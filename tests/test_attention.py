"""Tree attention: the log-sum-exp merge, the kernels, in-place batches and attention statistics."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.attention import Kernel, attention_mass, attention_reference, merge_partials
from arbor_runtime.attention import tree as tree_attention
from arbor_runtime.attention.call import AttentionCall
from arbor_runtime.attention.merge import RowPartials
from arbor_runtime.attention.tree import TreeBatch
from arbor_runtime.batch import Group, Piece
from arbor_runtime.kv import DevicePool, KVShape

# fp32 attention computed by different kernels / split points agrees to a few ulps of the
# output scale (values ~N(0, 1)); 1e-5 leaves room for the merge's extra roundings.
TOL = 1e-5
KERNELS = [pytest.param(True, id="fast"), pytest.param(False, id="reference")]


def sdpa(q, k, v, causal=False):
    """Plain softmax attention (B, H, M, D) with its log-sum-exp, the ground truth."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        m, n = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(torch.ones(m, n, dtype=torch.bool).triu(n - m + 1), float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def test_merge_of_split_keys_equals_attention_over_the_concatenation():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 16), torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    ref_o, ref_s = sdpa(q, k, v)
    out, lse = sdpa(q, k[:, :, :7], v[:, :, :7])
    for lo, hi in ((7, 8), (8, 30), (30, 40)):  # uneven parts, one of a single key
        out, lse = merge_partials(out, lse, *sdpa(q, k[:, :, lo:hi], v[:, :, lo:hi]))
    assert (out - ref_o).abs().max() < TOL and (lse - ref_s).abs().max() < TOL


@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_buffered_row_merge_equals_attention_over_each_rows_keys(capacity):
    """Partials over subsets of the rows (a block read by the rows whose path holds it), merged a buffer
    at a time, are attention over each row's own keys: rows that read a block twice or never, a partial
    of every row, one over more rows than the buffer holds, a row that sees no key at all."""
    torch.manual_seed(3)
    rows, h, m, d = 5, 2, 3, 8
    q = torch.randn(rows, h, m, d)
    keys: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(rows)]
    own_k, own_v = torch.randn(rows, h, 4, d), torch.randn(rows, h, 4, d)
    out, lse = sdpa(q, own_k, own_v)
    out[4], lse[4] = 0.0, float("-inf")  # row 4 sees no own key
    partials = RowPartials(out, lse, capacity)
    for step in range(12):
        who = None if step == 5 else torch.randperm(4)[: 1 + step % 4]  # row 4 reads nothing
        k, v = torch.randn(1, h, 1 + step, d), torch.randn(1, h, 1 + step, d)
        picked = list(range(rows)) if who is None else who.tolist()
        o, s = sdpa(q[picked], k.expand(len(picked), -1, -1, -1), v.expand(len(picked), -1, -1, -1))
        if who is None:  # a row seeing no key gets out 0 and lse -inf from every partial
            o[4], s[4] = 0.0, float("-inf")
        for r in picked:
            keys[r].append((k[0], v[0]))
        partials.add(who, o, s)
    got_o, got_s = partials.result()
    for r in range(4):
        k = torch.cat([own_k[r], *(kk for kk, _ in keys[r])], dim=1)
        v = torch.cat([own_v[r], *(vv for _, vv in keys[r])], dim=1)
        ref_o, ref_s = sdpa(q[r : r + 1], k[None], v[None])
        assert (got_o[r] - ref_o[0]).abs().max() < TOL and (got_s[r] - ref_s[0]).abs().max() < TOL
    assert torch.equal(got_o[4], torch.zeros(h, m, d)) and torch.isneginf(got_s[4]).all()


@pytest.mark.parametrize("fast", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_kernels_return_output_and_logsumexp(fast, causal):
    torch.manual_seed(1)
    pool = torch.randn(3, 3000, 32)  # keys read as strided views of a larger tensor
    q, k, v = torch.randn(1, 3, 20, 32), pool[None, :, 100:1400], pool[None, :, 1500:2800]
    kernel = Kernel(torch.device("cpu"), use_fast=fast)
    if fast:
        assert kernel.fast is not None, "this torch build should have the fused CPU kernel"
    if causal:
        k, v = k[:, :, :20], v[:, :, :20]
    out, lse = kernel(q, k, v, 32**-0.5, causal=causal)
    ref_o, ref_s = sdpa(q, k, v, causal)
    assert (out - ref_o).abs().max() < TOL and (lse - ref_s).abs().max() < 1e-4


def test_reference_kernel_chunks_keys_exactly():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 2500, 8), torch.randn(1, 2, 2500, 8)  # 3 key chunks
    out, lse = attention_reference(q, k, v, 8**-0.5)
    ref_o, ref_s = sdpa(q, k, v)
    assert (out - ref_o).abs().max() < TOL and (lse - ref_s).abs().max() < 1e-4


@pytest.mark.parametrize("causal", [False, True])
def test_attention_mass_equals_direct_softmax(causal):
    torch.manual_seed(3)
    q, k = torch.randn(1, 3, 700, 16), torch.randn(1, 3, 1300 if not causal else 700, 16)  # several tiles
    _, lse = sdpa(q, k, k, causal)
    mass = attention_mass(q, k, lse, 16**-0.5, causal=causal)
    scores = q @ k.transpose(-1, -2) * 16**-0.5
    if causal:
        scores = scores.masked_fill(torch.ones(700, 700, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(scores, -1).sum(dim=(0, 1, 2))
    assert torch.allclose(mass, ref, atol=1e-3, rtol=1e-4)
    assert abs(float(mass.sum()) - 3 * 700) < 1e-2  # every query spreads one unit per head


class FakeLayer:
    layer_idx = 0


@pytest.mark.parametrize("fused", [True, False], ids=["fused-stats", "two-pass-stats"])
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "in-place"])
@pytest.mark.parametrize("fast", KERNELS)
def test_tree_batch_equals_attention_over_each_rows_concatenated_path(fast, pack, fused, monkeypatch):
    """Three rows with ragged paths over shared blocks (GQA 6 query / 2 kv heads), decode step; the
    root's two pieces apart in the pool read as one packed copy or one view each; the statistics in
    the attention's own pass (the scores kept until the log-sum-exp is final) or in a second pass
    (a context too long for one score tile: here, a tile of 8 keys)."""
    monkeypatch.setattr(tree_attention, "PACK_BELOW_TOKENS", 512 if pack else 0)
    monkeypatch.setattr(tree_attention, "KEY_CHUNK", 1024 if fused else 8)
    torch.manual_seed(4)
    shape = KVShape(layers=1, kv_heads=2, head_dim=16, dtype=torch.float32, device=torch.device("cpu"))
    pool = DevicePool(shape, 200, fixed=True)
    pool.arenas[0].keys.normal_()
    pool.arenas[0].values.normal_()
    # blocks: root [0, 30) + [100, 120) in two segments, a [60, 70), b [80, 95); own tokens at 150+
    root = [Piece(0, 0, torch.arange(30)), Piece(0, 100, torch.arange(30, 50))]
    a, b = [Piece(1, 60, torch.arange(10))], [Piece(2, 80, torch.arange(15))]
    groups = [Group(0, None, 3, root), Group(1, torch.tensor([0, 1]), 2, a), Group(2, torch.tensor([2]), 1, b)]
    own = torch.tensor([[150, 151, 152], [160, 161, 161], [170, 170, 170]])
    valid = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
    write = torch.tensor([[152], [161], [170]])
    batch = TreeBatch(pool, groups, 3, 1, write, own, valid, stats=True, kernel=Kernel(shape.device, fast))
    assert any(r.packed for r in batch._reads[0]) == pack and not batch._reads[1][0].packed  # a lone piece: in place
    assert batch.fused_stats is fused
    query, key, value = torch.randn(3, 6, 1, 16), torch.randn(3, 2, 1, 16), torch.randn(3, 2, 1, 16)
    batch.update(key, value, 0)
    out = batch.attend(FakeLayer.layer_idx, query, key, value, AttentionCall(16**-0.5))  # (R, q, Hq, D)
    root_slots = [*range(30), *range(100, 120)]
    paths = [
        [*root_slots, *range(60, 70), 150, 151, 152],
        [*root_slots, *range(60, 70), 160, 161],
        [*root_slots, *range(80, 95), 170],
    ]
    total_mass = {}
    for r, slots in enumerate(paths):
        k, v = (t.repeat_interleave(3, dim=0) for t in pool.gather_layer(0, torch.tensor(slots)))  # (Hq, S, D)
        ref, _ = sdpa(query[r : r + 1], k[None], v[None])
        assert (out[r, 0] - ref[0, :, 0]).abs().max() < TOL
        probs = torch.softmax(query[r] @ k.transpose(-1, -2) * 16**-0.5, -1).sum(dim=(0, 1))
        for slot, p in zip(slots, probs, strict=True):
            total_mass[slot] = total_mass.get(slot, 0.0) + float(p)
    got = {}
    for grp in batch.groups:
        for piece, mass in zip(grp.pieces, grp.mass, strict=True):
            for j, m in enumerate(mass.tolist()):
                got[piece.start + j] = m
    for r in range(3):
        for j in range(int(valid[r].sum())):
            got[int(own[r, j])] = float(batch.own_mass[r, j])
    assert got.keys() == total_mass.keys()
    assert max(abs(got[s] - total_mass[s]) for s in got) < 1e-4


@pytest.mark.parametrize("fast", KERNELS)
def test_a_plain_decode_step_attends_its_own_tokens_through_the_kernel(fast):
    """Rows that read every own slot, statistics off: the own tokens go through the attention kernel
    (no scores kept), and each row still gets attention over its concatenated path."""
    torch.manual_seed(5)
    shape = KVShape(layers=1, kv_heads=2, head_dim=16, dtype=torch.float32, device=torch.device("cpu"))
    pool = DevicePool(shape, 200, fixed=True)
    pool.arenas[0].keys.normal_()
    pool.arenas[0].values.normal_()
    groups = [
        Group(0, None, 2, [Piece(0, 0, torch.arange(40))]),
        Group(1, torch.tensor([1]), 1, [Piece(1, 60, torch.arange(9))]),
    ]
    own = torch.tensor([[150, 151, 152, 153], [170, 171, 172, 173]])
    valid = torch.ones(2, 4, dtype=torch.bool)
    batch = TreeBatch(pool, groups, 2, 1, own[:, -1:], own, valid, stats=False, kernel=Kernel(shape.device, fast))
    assert batch._own_plain
    query, key, value = torch.randn(2, 6, 1, 16), torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    batch.update(key, value, 0)
    out = batch.attend(0, query, key, value, AttentionCall(16**-0.5))
    paths = [[*range(40), *range(150, 154)], [*range(40), *range(60, 69), *range(170, 174)]]
    for r, slots in enumerate(paths):
        k, v = (t.repeat_interleave(3, dim=0) for t in pool.gather_layer(0, torch.tensor(slots)))
        ref, _ = sdpa(query[r : r + 1], k[None], v[None])
        assert (out[r, 0] - ref[0, :, 0]).abs().max() < TOL


def test_runtime_attributes_attention_to_blocks(tiny):
    rt = Runtime(tiny, policy="h2o")
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    layers, heads = tiny.model.config.num_hidden_layers, tiny.model.config.num_attention_heads
    # every query (the prompt's prefill and each decoded token) spreads one unit of mass per
    # head and layer over what it sees
    queries = root.length + sum(k.length for k in kids)
    total = rt.store.get(root.id).attention.sum() + sum(rt.store.get(k.id).attention.sum() for k in kids)
    assert abs(float(total) - queries * layers * heads) < 1e-2
    assert rt.store.get(root.id).attention.sum() > 0


def test_observers_count_the_queries_that_saw_each_block(tiny):
    rt = Runtime(tiny, policy="h2o")  # statistics on every forward (arbor's only under memory pressure)
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    # the prompt's own prefill (half of its queries see a given token on average) + every decode query
    assert rt.store.get(root.id).observers == root.length / 2 + sum(k.length for k in kids)
    assert [rt.store.get(k.id).observers for k in kids] == [k.length / 2 for k in kids]


def test_model_attention_implementation_is_restored(tiny):
    rt = Runtime(tiny, policy="h2o")
    rt.expand(rt.new_tree("Input: 1 2 3 4\n"), 2, SamplingParams(max_new_tokens=3, temperature=1.0, seed=0))
    assert tiny.model.config._attn_implementation == "sdpa"
