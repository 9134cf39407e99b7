"""Attention statistics for every query, prompts included, against a direct softmax on the tiny model,
and the observation window (SnapKV)."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import Runtime
from arbor_runtime.attention import KEY_CHUNK, QUERY_CHUNK
from arbor_runtime.policies import SnapKVPolicy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: longer than a query tile and a key tile of the statistics pass, so both are split
LONG = QUERY_CHUNK + KEY_CHUNK // 2 + 37


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 5000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.inference_mode()
def direct_attention(model, ids: list[int]) -> torch.Tensor:
    """(L, H, N, N) softmax probabilities of a plain eager forward over ``ids`` (the ground truth)."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        model.config._attn_implementation = previous
    return torch.stack([a[0] for a in out.attentions]).float()


def mass(probs: torch.Tensor, queries: slice, keys: slice) -> torch.Tensor:
    """(keys,) mass the keys receive from the queries, summed over layers, heads and queries."""
    return probs[:, :, queries, keys].sum(dim=(0, 1, 2))


def test_prompt_mass_over_a_long_prefill_equals_a_direct_softmax(tiny):
    ids = random_ids(LONG, seed=1)
    assert len(ids) > QUERY_CHUNK and len(ids) > KEY_CHUNK
    rt = Runtime(tiny, policy="h2o")
    root = rt.new_tree_ids(ids)
    probs = direct_attention(tiny.model, ids)
    want = mass(probs, slice(None), slice(None))
    got = rt.store.get(root.id).attention
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-3)
    assert float(got.max()) > 20 * float(got.median())  # a peaked pattern: the comparison is not vacuous


def test_forced_block_mass_over_its_context_and_itself_equals_a_direct_softmax(tiny):
    prompt, forced = random_ids(300, seed=2), random_ids(90, seed=3)
    rt = Runtime(tiny, policy="h2o")
    root = rt.new_tree_ids(prompt)
    before = rt.store.get(root.id).attention.clone()
    child = rt.append_ids(root, forced)
    probs = direct_attention(tiny.model, prompt + forced)
    n = len(prompt)
    got_root = rt.store.get(root.id).attention - before
    assert torch.allclose(got_root, mass(probs, slice(n, None), slice(0, n)), rtol=1e-4, atol=1e-3)
    assert torch.allclose(rt.store.get(child.id).attention, mass(probs, slice(n, None), slice(n, None)), atol=1e-3)


def test_window_records_the_mass_of_the_last_queries_only_and_replaces_the_old_record(tiny):
    prompt, forced, w = random_ids(200, seed=4), random_ids(40, seed=5), 16
    rt = Runtime(tiny, policy=SnapKVPolicy(window_size=w))
    root = rt.new_tree_ids(prompt)
    probs = direct_attention(tiny.model, prompt)
    n = len(prompt)
    assert torch.allclose(rt.store.get(root.id).attention, mass(probs, slice(n - w, n), slice(0, n)), atol=1e-4)
    rt.append_ids(root, forced)  # a newer window: the root's record is now what the forced block's window gave
    probs = direct_attention(tiny.model, prompt + forced)
    end = n + len(forced)
    assert torch.allclose(rt.store.get(root.id).attention, mass(probs, slice(end - w, end), slice(0, n)), atol=1e-4)


def test_decode_queries_do_not_count_under_an_observation_window(tiny):
    from arbor_runtime import SamplingParams

    rt = Runtime(tiny, policy=SnapKVPolicy(window_size=8))
    root = rt.new_tree_ids(random_ids(50, seed=6))
    record = rt.store.get(root.id).attention.clone()
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    assert torch.equal(rt.store.get(root.id).attention, record)
    assert all(float(rt.store.get(k.id).attention.abs().sum()) == 0.0 for k in kids)


def test_snapkv_keeps_the_tokens_its_window_attends_to(tiny):
    ids, w, kernel, target = random_ids(400, seed=7), 32, 5, 120
    rt = Runtime(tiny, policy=SnapKVPolicy(window_size=w, kernel_size=kernel))
    root = rt.new_tree_ids(ids)
    assert rt.compress(target) == target
    n = len(ids)
    scores = mass(direct_attention(tiny.model, ids), slice(n - w, n), slice(0, n - w))  # before the window
    pooled = torch.nn.functional.avg_pool1d(scores.view(1, 1, -1), kernel, stride=1, padding=kernel // 2).view(-1)
    chosen = torch.topk(pooled, target - w).indices
    want = torch.sort(torch.cat([chosen, torch.arange(n - w, n)])).values
    assert torch.equal(rt.store.get(root.id).kept, want)
    unpooled = torch.topk(scores, target - w).indices
    assert not torch.equal(torch.sort(chosen).values, torch.sort(unpooled).values)  # pooling mattered
