"""GPU-only checks (skipped without CUDA): pinned host tier on a side stream, exactness on device."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import Runtime, SamplingParams, load_model
from arbor_runtime.kv.host import HostTier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_host_tier_round_trip_is_bit_identical_on_cuda():
    device = torch.device("cuda")
    tier = HostTier(device)
    keys = torch.randn(4, 2, 16, 8, device=device, dtype=torch.bfloat16)
    values = torch.randn_like(keys)
    idx = torch.arange(16)
    tier.put(7, idx, keys, values)
    assert tier.tokens == 16 and tier.bytes_to_host == 2 * keys.numel() * keys.element_size()
    back_k, back_v = tier.take(7, idx)
    assert back_k.device.type == "cuda" and torch.equal(back_k, keys) and torch.equal(back_v, values)


def test_arbor_on_cuda_matches_full():
    lm = load_model("tiny-random", device="cuda", dtype="float32")
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    outs = []
    for policy, budget in (("full", None), ("arbor", 60)):
        rt = Runtime(lm, policy=policy, budget_tokens=budget)
        root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
        kids = rt.expand(root, 3, params)
        for kid in kids:
            rt.expand(kid, 2, params)
        rt.expand(kids[0].children[0], 1, params)
        outs.append([n.token_ids for n in rt.all_nodes.values()])
    assert outs[0] == outs[1]
