"""A branched tree under the full policy is exact on every path: each root-to-leaf path's tokens are
what transformers' greedy ``generate`` writes on that path's flattened tokens, and every block's
log-probs are those of one plain forward pass over the path (up to rounding).

The tree has siblings made by forced appends and by one node expanded twice, two batched expansions
over paths of different lengths (ragged rows in one decode step), and paths of depth 4.
"""

from __future__ import annotations

import pytest
import torch
from floats import reassociation_tol

from arbor_runtime import Node, Runtime, SamplingParams
from arbor_runtime.tree import GENERATED

pytestmark = pytest.mark.exactness  # CI runs these again under another ATEN_CPU_CAPABILITY

PROMPT = "Input: 4 4 6 8\nSteps:\n"


def grow(rt: Runtime, params: SamplingParams) -> list[Node]:
    """The branched tree, grown with greedy expansions; returns its leaves."""
    root = rt.new_tree(PROMPT)
    (gen,) = rt.expand(root, 1, params)
    plus = rt.append(root, "4 + 8 = 12 (left: 4 6 12)\n")
    times = rt.append(root, "6 * 4 = 24 (left: 4 8 24)\n")
    # depth 2: one batch over three parents of three path lengths; `plus` gets two (equal) greedy children
    (gen2,), (plus_a, _), (times_a,) = rt.expand_many([(gen, 1), (plus, 2), (times, 1)], params)
    # depth 3 and 4: a forced step below a generated block, then a second ragged batch
    step = rt.append(gen2, "\n12 - 4 = 8 (left: 8)\n")
    rt.expand_many([(step, 1), (plus_a, 1), (times_a, 2)], params)
    leaves = [n for n in root.subtree() if not n.children]
    assert len(leaves) == 5 and max(n.depth for n in leaves) == 4
    assert len({tuple(rt.path_token_ids(n)) for n in leaves}) >= 4  # siblings differ (but the twins)
    return leaves


def greedy_generate(model, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy ``generate``: ``ids`` and exactly ``new_tokens`` more."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return out[0].tolist()


def plain_logprobs(model, ids: list[int]) -> torch.Tensor:
    """(T, V) float32 log-probabilities of one forward pass over ``ids``."""
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_every_path(loaded, rt: Runtime, leaves: list[Node]) -> int:
    """Every leaf's path against generate and a plain forward; returns the generated blocks checked."""
    model, checked = loaded.model, 0
    for leaf in leaves:
        path, ids = leaf.path(), rt.path_token_ids(leaf)
        assert ids == [t for node in path for t in node.token_ids]
        ref = plain_logprobs(model, ids)
        for node in path[1:]:
            s, e = node.start_pos, node.end_pos
            if node.kind == GENERATED:
                assert greedy_generate(model, ids[:s], node.length) == ids[:e], (leaf.id, node.id)
                checked += 1
            want = ref[s - 1 : e - 1].gather(-1, torch.tensor(ids[s:e]).view(-1, 1)).squeeze(-1)
            diff = (torch.tensor(node.logprobs) - want).abs().max()
            assert float(diff) <= reassociation_tol(loaded, want.tolist()), (leaf.id, node.id)
        after = rt.next_token_logprobs(leaf)
        scale = float(ref[-1].abs().max())
        assert float((after - ref[-1]).abs().max()) <= reassociation_tol(loaded, [scale]), leaf.id
    return checked


def test_every_path_of_a_branched_tree_equals_generate_tiny(tiny):
    rt = Runtime(tiny, policy="full")
    leaves = grow(rt, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert check_every_path(tiny, rt, leaves) >= 5 * 2  # every leaf's path holds two or more generated blocks


@pytest.mark.slow
def test_every_path_of_a_branched_tree_equals_generate_smollm2(smollm2):
    rt = Runtime(smollm2, policy="full")
    leaves = grow(rt, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert check_every_path(smollm2, rt, leaves) >= 5 * 2
