"""Attention statistics: the recorder matches a plain softmax and leaves model outputs unchanged."""

from __future__ import annotations

import torch

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.attention import AttentionRecorder, recording


def test_recorder_matches_reference_softmax_with_gqa_and_mask():
    torch.manual_seed(0)
    b, hq, hkv, q, s, d = 2, 9, 3, 2, 7, 8
    query, key = torch.randn(b, hq, q, d), torch.randn(b, hkv, s, d)
    mask = torch.ones(b, 1, q, s, dtype=torch.bool)
    mask[1, :, :, 5:] = False
    rec = AttentionRecorder(b, s, torch.device("cpu"))
    rec.observe(None, query, key, mask, None)
    scores = query @ key.repeat_interleave(hq // hkv, dim=1).transpose(-1, -2) * d**-0.5
    ref = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).sum(dim=(1, 2))
    assert torch.allclose(rec.mass, ref, atol=1e-5)
    assert rec.mass[1, 5:].abs().sum() == 0  # masked (padding) slots receive nothing
    assert torch.allclose(rec.mass.sum(1), torch.full((b,), float(hq * q)))


def test_recording_leaves_logits_unchanged_and_restores_attention(tiny):
    model = tiny.model
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        plain = model(ids).logits
        rec = AttentionRecorder(1, 4, torch.device("cpu"))
        with recording(model, rec):
            seen = model(ids).logits
    assert torch.equal(plain, seen)
    assert rec.mass.sum() > 0
    assert model.config._attn_implementation == "sdpa"


def test_runtime_attributes_attention_to_blocks(tiny):
    rt = Runtime(tiny, policy="h2o")
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    layers, heads = tiny.model.config.num_hidden_layers, tiny.model.config.num_attention_heads
    # every query (the short prompt's prefill and each decoded token) spreads one unit of mass per
    # head and layer over what it sees
    queries = root.length + sum(k.length for k in kids)
    total = rt.store.get(root.id).attention.sum() + sum(rt.store.get(k.id).attention.sum() for k in kids)
    assert abs(float(total) - queries * layers * heads) < 1e-2
    assert rt.store.get(root.id).attention.sum() > 0


def test_observers_count_the_queries_that_saw_each_block(tiny):
    rt = Runtime(tiny, policy="arbor")
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    # the prompt's own prefill (half of its queries see a given token on average) + every decode query
    assert rt.store.get(root.id).observers == root.length / 2 + sum(k.length for k in kids)
    assert [rt.store.get(k.id).observers for k in kids] == [k.length / 2 for k in kids]
