"""ArborKV with a capped host tier: spans that do not fit the host are dropped, and a branch the
search returns to is rebuilt by recompute, generating what ``full`` generates."""

from __future__ import annotations

import pytest

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import ArborPolicy

PROMPT = "Input: 4 4 6 8\nSteps:\n"
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
BUDGET, HOST_CAP = 45, 5  # full needs 62 device tokens for this script; the host holds 5 tokens at most

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def grow(rt: Runtime):
    """Three thoughts under the prompt, then four levels down the third (the first two go cold)."""
    root = rt.new_tree(PROMPT)
    kids = rt.expand(root, 3, GREEDY)
    deep = kids[2]
    for _ in range(4):
        deep = rt.expand(deep, 1, GREEDY)[0]
    return kids


@pytest.mark.parametrize("granularity", ["token", "head"])
def test_host_cap_drops_spans_and_recompute_brings_a_branch_back(tiny, granularity):
    full = Runtime(tiny, policy="full")
    full_kids = grow(full)
    rt = Runtime(tiny, policy=ArborPolicy(budget_tokens=BUDGET, host_budget_tokens=HOST_CAP, granularity=granularity))
    kids = grow(rt)
    assert full.metrics.peak_device_tokens > BUDGET >= rt.metrics.peak_device_tokens
    assert all(p.host_tokens <= HOST_CAP for p in rt.metrics.trace)  # the cap holds after every operation
    assert rt.metrics.dropped_tokens > 0 and rt.metrics.recomputed_tokens == 0
    gone = [i for i, kid in enumerate(kids[:2]) if rt.residency(kid)["dropped"] == kid.length]
    assert gone, "a cold branch left every tier"
    i = gone[0]
    back = rt.expand(kids[i], 1, GREEDY)[0]  # the search returns to it: recomputed, not rehydrated
    assert rt.residency(kids[i]) == {"device": kids[i].length, "host": 0, "dropped": 0}
    assert rt.metrics.recomputed_tokens >= kids[i].length
    assert back.token_ids == full.expand(full_kids[i], 1, GREEDY)[0].token_ids
    assert [n.token_ids for n in rt.nodes.values()] == [n.token_ids for n in full.nodes.values()]
