"""What a layer asks through the attention interface, served by the tree attention: sliding windows
on original positions, soft caps, learned sinks, and their attention statistics, each against a
direct softmax over the row's concatenated path; and the keyword arguments refused."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime.attention import Kernel, attention_mass
from arbor_runtime.attention import tree as tree_attention
from arbor_runtime.attention.call import AttentionCall, attention_call
from arbor_runtime.attention.tree import TreeBatch
from arbor_runtime.attention.window import visibility
from arbor_runtime.batch import Group, Piece
from arbor_runtime.errors import UnsupportedModelError
from arbor_runtime.kv import DevicePool, KVShape

TOL = 1e-5
KERNELS = [pytest.param(True, id="fast"), pytest.param(False, id="reference")]
CALLS = {
    "window": dict(window=9),
    "softcap": dict(softcap=0.5),  # far below the random scores' size: the cap bites
    "sinks": dict(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, -0.5])),
    "all": dict(window=12, softcap=0.5, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, -0.5])),
}


def direct(q, k, v, qpos, kpos, call: AttentionCall, causal_own: int = 0):
    """Softmax over one row's keys, by the spec: q (Hq, M, D); k, v (Hq, N, D); positions (M,), (N,).

    Returns (out (Hq, M, D), probabilities (Hq, M, N)) with sinks in the denominator only."""
    scores = q @ k.transpose(-1, -2) * call.scale
    if call.softcap is not None:
        scores = torch.tanh(scores / call.softcap) * call.softcap
    seen = kpos.unsqueeze(0) <= qpos.unsqueeze(1)
    if call.window is not None:
        seen &= qpos.unsqueeze(1) - kpos.unsqueeze(0) < call.window
    scores = scores.masked_fill(~seen, float("-inf"))
    if call.sinks is not None:
        sink = call.sinks.view(-1, 1, 1).expand(-1, q.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    return probs @ v, probs


def make_pool(slots: int) -> DevicePool:
    shape = KVShape(layers=1, kv_heads=2, head_dim=16, dtype=torch.float32, device=torch.device("cpu"))
    pool = DevicePool(shape, slots, fixed=True)
    pool.arenas[0].keys.normal_()
    pool.arenas[0].values.normal_()
    return pool


def tree_groups():
    """Root (positions 0..29, tokens 10..19 evicted: two pieces, the second one out of pool order),
    child a (30..41) on rows 0-1, child b (30..44) on row 2."""
    root = [Piece(0, 0, torch.arange(10)), Piece(0, 100, torch.arange(20, 30))]
    a, b = [Piece(1, 60, torch.arange(12))], [Piece(2, 80, torch.arange(15))]
    return [
        Group(0, None, 3, root, start_pos=0),
        Group(1, torch.tensor([0, 1]), 2, a, start_pos=30),
        Group(2, torch.tensor([2]), 1, b, start_pos=30),
    ]


def context(groups, row):
    """(slots, positions) of a row's context keys."""
    slots, pos = [], []
    for grp in groups:
        if grp.rows is None or row in grp.rows.tolist():
            for p in grp.pieces:
                slots += list(range(p.start, p.start + p.length))
                pos += (grp.start_pos + p.idx).tolist()
    return slots, pos


def masses(batch) -> dict[int, float]:
    """Pool slot -> attention mass the batch recorded (context pieces and own tokens)."""
    got = {}
    for grp in batch.groups:
        for piece, mass in zip(grp.pieces, grp.mass, strict=True):
            got.update({piece.start + j: m for j, m in enumerate(mass.tolist())})
    return got


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "in-place"])
@pytest.mark.parametrize("fast", KERNELS)
@pytest.mark.parametrize("what", CALLS)
def test_decode_step_serves_windows_softcaps_and_sinks(what, fast, pack, monkeypatch):
    """Three decode rows at different positions over a shared, partly evicted root: the window cuts
    through some pieces, leaves out others; outputs and per-key masses equal the direct softmax."""
    monkeypatch.setattr(tree_attention, "PACK_BELOW_TOKENS", 512 if pack else 0)
    torch.manual_seed(5)
    pool, groups = make_pool(200), tree_groups()
    own = torch.tensor([[150, 151, 152], [160, 161, 161], [170, 170, 170]])
    valid = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
    counts = valid.sum(1)
    starts = torch.tensor([42, 42, 45])  # own tokens follow the last context block
    batch = TreeBatch(
        pool, groups, 3, 1, own.gather(1, (counts - 1).view(-1, 1)), own, valid, True, Kernel(pool.device, fast)
    )
    batch.positions = (starts + counts - 1).view(-1, 1)
    call = AttentionCall(16**-0.5, **CALLS[what])
    query, kv = torch.randn(3, 6, 1, 16), torch.randn(3, 2, 1, 16)
    batch.update(kv, kv.clone(), 0)
    out = batch.attend(0, query, kv, kv, call)
    want_mass: dict[int, float] = {}
    for r in range(3):
        slots, pos = context(groups, r)
        n = int(counts[r])
        slots, pos = slots + own[r, :n].tolist(), pos + list(range(int(starts[r]), int(starts[r]) + n))
        k, v = (t.repeat_interleave(3, dim=0) for t in pool.gather_layer(0, torch.tensor(slots)))
        ref, probs = direct(query[r], k, v, batch.positions[r], torch.tensor(pos), call)
        assert (out[r, 0] - ref[:, 0]).abs().max() < TOL, r
        for slot, p in zip(slots, probs.sum(dim=(0, 1)).tolist(), strict=True):
            want_mass[slot] = want_mass.get(slot, 0.0) + p
    got = masses(batch)
    for r in range(3):
        got.update({int(own[r, j]): float(batch.own_mass[r, j]) for j in range(int(counts[r]))})
    assert max(abs(got.get(s, 0.0) - m) for s, m in want_mass.items()) < 1e-4
    if what in ("window", "all"):
        assert min(want_mass.values()) == 0.0, "some keys lie outside every window"


@pytest.mark.parametrize("stats_from", [0, 3])
@pytest.mark.parametrize("fast", KERNELS)
@pytest.mark.parametrize("what", CALLS)
def test_prefill_serves_windows_softcaps_and_sinks(what, fast, stats_from):
    """Two rows of 6 new tokens (a chunk) over their paths: new tokens see each other causally and
    within the window; the statistics of an observation window (``stats_from``) too."""
    torch.manual_seed(6)
    pool, groups = make_pool(200), tree_groups()[:2]
    groups[0].n_rows = groups[1].n_rows = 2
    groups[1].rows = None  # both rows read root and a
    write = torch.arange(150, 162).view(2, 6)
    batch = TreeBatch(pool, groups, 2, 6, write, stats=True, kernel=Kernel(pool.device, fast), stats_from=stats_from)
    batch.positions = torch.arange(42, 48).expand(2, 6)
    call = AttentionCall(16**-0.5, **CALLS[what])
    query, key, value = torch.randn(2, 6, 6, 16), torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    batch.update(key, value, 0)
    out = batch.attend(0, query, key, value, call)  # (R, q, Hq, D)
    want_mass: dict[int, float] = {}
    for r in range(2):
        slots, pos = context(groups, r)
        slots, pos = slots + write[r].tolist(), pos + list(range(42, 48))
        k, v = (t.repeat_interleave(3, dim=0) for t in pool.gather_layer(0, torch.tensor(slots)))
        ref, probs = direct(query[r], k, v, batch.positions[r], torch.tensor(pos), call)
        assert (out[r].transpose(0, 1) - ref).abs().max() < TOL, r
        for slot, p in zip(slots, probs[:, stats_from:].sum(dim=(0, 1)).tolist(), strict=True):
            want_mass[slot] = want_mass.get(slot, 0.0) + p
    got = masses(batch)
    got.update({int(write[r, j]): float(batch.own_mass[r, j]) for r in range(2) for j in range(6)})
    assert max(abs(got.get(s, 0.0) - m) for s, m in want_mass.items()) < 1e-4


@pytest.mark.parametrize("fast", KERNELS)
def test_masked_kernel_gives_an_unseeing_query_nothing(fast):
    """A query the mask leaves without keys: lse -inf and no weight in a merge (never NaN)."""
    torch.manual_seed(7)
    q, k, v = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1] = False
    mask[2, 3:] = False
    out, lse = Kernel(torch.device("cpu"), fast)(q, k, v, 0.25, mask=mask)
    assert torch.isneginf(lse[..., 1]).all() and torch.isfinite(out).all()
    ref_o, _ = direct(q[0], k[0], v[0], torch.full((4,), 9), torch.arange(5), AttentionCall(0.25))
    partial, _ = direct(q[0, :, 2:3], k[0, :, :3], v[0, :, :3], torch.tensor([9]), torch.arange(3), AttentionCall(0.25))
    assert (out[0, :, 0] - ref_o[:, 0]).abs().max() < TOL and (out[0, :, 2] - partial[:, 0]).abs().max() < TOL
    assert attention_mass(q, k, lse.masked_fill(torch.isneginf(lse), 0.0), 0.25, mask=mask)[3:].sum() > 0


def test_visibility_reads_whole_pieces_unmasked_and_skips_unseen_ones():
    qpos = torch.tensor([20, 21])
    assert visibility(qpos, torch.arange(15, 20), 8) is True  # 21 - 15 < 8
    assert visibility(qpos, torch.arange(0, 12), 8) is False  # 20 - 11 >= 8
    mask = visibility(qpos, torch.arange(10, 16), 8)
    assert mask.tolist() == [[False, False, False, True, True, True], [False, False, False, False, True, True]]
    # original positions, not the count of keys: an evicted gap does not pull old keys into the window
    assert visibility(qpos, torch.tensor([2, 3, 19]), 8).tolist() == [[False, False, True]] * 2


class _Module:
    layer_idx = 0

    class config:  # noqa: N801 (transformers' attribute name)
        model_type = "toy"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alibi_slopes": torch.ones(4)}, "'toy': its attention passes alibi_slopes"),
        ({"dropout": 0.1}, "dropout 0.1"),
        ({"is_causal": False}, "non-causal"),
        ({"sliding_window": 0}, "sliding_window=0"),
    ],
)
def test_attention_arguments_it_does_not_implement_are_refused(kwargs, message):
    with pytest.raises(UnsupportedModelError, match=message):
        attention_call(_Module(), torch.zeros(1, 4, 2, 16), kwargs)


def test_attention_call_reads_what_a_layer_passes():
    sinks = torch.zeros(4)
    kwargs = {"scaling": 0.5, "sliding_window": 8, "softcap": 50.0, "s_aux": sinks, "dropout": 0.0}
    call = attention_call(_Module(), torch.zeros(1, 4, 2, 16), kwargs | {"position_ids": None, "use_cache": True})
    assert (call.scale, call.window, call.softcap, call.sinks is sinks) == (0.5, 8, 50.0, True)
    assert attention_call(_Module(), torch.zeros(1, 4, 2, 16), {}).scale == 16**-0.5
