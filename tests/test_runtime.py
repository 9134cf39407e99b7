"""Runtime invariants: exactness vs transformers, block reuse, batching, budget, positions."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import BudgetError, KVBudgetExceeded, Runtime, SamplingParams

pytestmark = pytest.mark.exactness  # CI runs these again under another ATEN_CPU_CAPABILITY

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
PROMPT = "Input: 4 4 6 8\nSteps:\n"


def greedy_chain(rt: Runtime, depth: int, params: SamplingParams = GREEDY):
    node = rt.new_tree(PROMPT)
    for _ in range(depth):
        node = rt.expand(node, 1, params)[0]
    return node


def reference_generate(model, ids: list[int], new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    return out[0].tolist()


def reference_logprobs(model, ids: list[int]) -> torch.Tensor:
    """(T, V) log-probabilities of a plain forward pass on the flattened ids."""
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("depth", [1, 3])
def test_greedy_path_equals_generate_tiny(tiny, depth):
    rt = Runtime(tiny)
    leaf = greedy_chain(rt, depth)
    root_ids = rt.path_token_ids(leaf.root)
    path_ids = rt.path_token_ids(leaf)
    assert path_ids == reference_generate(tiny.model, root_ids, len(path_ids) - len(root_ids))


def test_greedy_path_equals_generate_smollm2(smollm2):
    rt = Runtime(smollm2)
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop=["\n"])
    leaf = greedy_chain(rt, 2, params)
    root_ids, path_ids = rt.path_token_ids(leaf.root), rt.path_token_ids(leaf)
    assert len(path_ids) > len(root_ids) + 2
    assert path_ids == reference_generate(smollm2.model, root_ids, len(path_ids) - len(root_ids))
    # the next-token distribution after the path matches a plain forward pass
    ref = reference_logprobs(smollm2.model, path_ids)[-1]
    assert (rt.next_token_logprobs(leaf) - ref).abs().max() < 1e-4


def test_generated_logprobs_match_forward(tiny):
    rt = Runtime(tiny)
    leaf = greedy_chain(rt, 2)
    ids = rt.path_token_ids(leaf)
    ref = reference_logprobs(tiny.model, ids)
    start = leaf.start_pos
    expected = ref[start - 1 : len(ids) - 1].gather(-1, torch.tensor(ids[start:]).view(-1, 1)).squeeze(-1)
    assert torch.allclose(torch.tensor(leaf.logprobs), expected, atol=1e-4)


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_append_logprobs_equal_plain_forward(which, request):
    lm = request.getfixturevalue(which)
    rt = Runtime(lm)
    kid = rt.expand(rt.new_tree(PROMPT), 1, GREEDY)[0]
    forced = rt.append(kid, "4 + 8 = 12 (left: 4 6 12)\n")
    ids = rt.path_token_ids(forced)
    ref = reference_logprobs(lm.model, ids)
    s = forced.start_pos
    expected = ref[s - 1 : len(ids) - 1].gather(-1, torch.tensor(ids[s:]).view(-1, 1)).squeeze(-1)
    assert len(forced.logprobs) == forced.length
    assert (torch.tensor(forced.logprobs) - expected).abs().max() < 1e-4


def test_every_block_computed_once(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    kids = rt.expand(root, 3, SamplingParams(max_new_tokens=5, temperature=1.0, seed=1))
    grand = rt.expand_many([(kids[0], 2), (kids[2], 1)], SamplingParams(max_new_tokens=4, temperature=1.0))
    rt.append(grand[0][0], " forced text")
    prefill_before = rt.metrics.prefill_tokens
    deep = rt.expand(grand[0][0].children[0], 2, GREEDY)  # a depth-4 node: ancestors must not be prefilled
    assert rt.metrics.prefill_tokens == prefill_before
    nodes = list(root.subtree())
    prompt_or_forced = sum(n.length for n in nodes if n.kind in ("prompt", "forced"))
    generated = sum(n.length for n in nodes if n.kind == "generated")
    assert rt.metrics.prefill_tokens == prompt_or_forced
    assert rt.metrics.decode_tokens == generated
    assert rt.store.resident_tokens == sum(n.length for n in nodes)
    assert all(len(n.token_ids) == 4 or n.stop_reason for n in deep)


def test_expand_many_matches_one_by_one(tiny):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    a = rt.expand(root, 1, params)[0]
    b = rt.expand(a, 1, params)[0]
    c = rt.append(root, " another branch with a longer text")
    batched = rt.expand_many([(root, 1), (b, 2), (c, 1)], params)
    solo = [rt.expand(node, 1, params)[0] for node in (root, b, c)]
    assert [k.token_ids for k in batched[0]] == [solo[0].token_ids]
    assert [k.token_ids for k in batched[1]] == [solo[1].token_ids] * 2
    assert [k.token_ids for k in batched[2]] == [solo[2].token_ids]
    assert torch.allclose(torch.tensor(batched[1][0].logprobs), torch.tensor(solo[1].logprobs), atol=1e-4)


def test_positions_follow_the_path(tiny):
    rt = Runtime(tiny)
    leaf = greedy_chain(rt, 3)
    for node in leaf.path():
        block = rt.store.get(node.id)
        assert node.start_pos == (0 if node.parent is None else node.parent.end_pos)
        assert block.positions.tolist() == list(range(node.start_pos, node.end_pos))
        assert rt.store.read(node.id)[0].shape[2] == node.length


def test_stop_strings_end_blocks(smollm2):
    rt = Runtime(smollm2)
    params = SamplingParams(max_new_tokens=24, temperature=0.8, stop=["\n"], seed=3)
    kids = rt.expand(rt.new_tree(PROMPT), 4, params)
    for kid in kids:
        assert kid.stop_reason in ("stop", "eos", "length")
        if kid.stop_reason == "stop":
            assert "\n" in kid.text and "\n" not in rt.tokenizer.decode(kid.token_ids[:-1])
        else:
            assert "\n" not in kid.text
    assert any(k.stop_reason == "stop" for k in kids)


def test_seed_reproduces_samples(tiny):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)
    rt = Runtime(tiny)
    first = [k.token_ids for k in rt.expand(rt.new_tree(PROMPT), 4, params)]
    rt = Runtime(tiny)
    with pytest.raises(ValueError, match="another Runtime"):
        rt.expand(Runtime(tiny).new_tree(PROMPT), 1, params)
    second = [k.token_ids for k in rt.expand(rt.new_tree(PROMPT), 4, params)]
    assert first == second
    assert len({tuple(t) for t in first}) > 1  # temperature 1 on 4 rows gives different samples


def test_budget_overrun_raises_oom_and_never_passes_budget(tiny):
    probe = Runtime(tiny)
    root_len = len(probe.new_tree(PROMPT).token_ids)
    budget = root_len + 10
    rt = Runtime(tiny, policy="full", budget_tokens=budget)
    root = rt.new_tree(PROMPT)
    with pytest.raises(KVBudgetExceeded, match=f"budget_tokens={budget}"):
        rt.expand(root, 4, SamplingParams(max_new_tokens=8, temperature=1.0))
    assert rt.metrics.peak_device_tokens <= budget
    assert all(p.peak_tokens <= budget for p in rt.metrics.trace)


def test_budget_smaller_than_prompt_fails_up_front(tiny):
    rt = Runtime(tiny, budget_tokens=3)
    with pytest.raises(BudgetError, match="budget_tokens=3"):
        rt.new_tree(PROMPT)
    assert rt.metrics.forward_calls == 0


def test_release_frees_kv_and_blocks_reuse(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    kids = rt.expand(root, 2, GREEDY)
    grand = rt.expand(kids[0], 2, GREEDY)
    before = rt.store.resident_tokens
    rt.release(kids[0])
    assert rt.store.resident_tokens == before - kids[0].length - sum(g.length for g in grand)
    assert kids[0] not in root.children and kids[0].released
    with pytest.raises(ValueError, match="released"):
        rt.expand(grand[0], 1, GREEDY)


def test_bad_requests_are_rejected(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    with pytest.raises(ValueError, match="n=0"):
        rt.expand(root, 0)
    with pytest.raises(ValueError, match="unknown policy 'lru'"):
        Runtime(tiny, policy="lru")
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_memory_trace_records_every_operation(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    kid = rt.expand(root, 2, GREEDY)[0]
    rt.release(kid)
    ops = [p.op for p in rt.metrics.trace]
    assert ops == ["new_tree", "expand", "release"]
    assert rt.metrics.trace[-1].resident_tokens == rt.store.resident_tokens
    assert rt.metrics.trace[1].peak_tokens >= rt.metrics.trace[1].resident_tokens


def test_sampler_follows_the_distribution_and_filters():
    from arbor_runtime.sampling import sample_tokens

    gen = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.0, 0.7]])).expand(4000, 4)
    counts = torch.bincount(sample_tokens(logits, SamplingParams(temperature=1.0), gen), minlength=4) / 4000
    assert counts[2] == 0 and abs(counts[3] - 0.7) < 0.03 and abs(counts[0] - 0.1) < 0.02
    assert set(sample_tokens(logits, SamplingParams(temperature=1.0, top_k=1), gen).tolist()) == {3}
    assert set(sample_tokens(logits, SamplingParams(temperature=1.0, top_p=0.5), gen).tolist()) == {3}
    assert set(sample_tokens(logits, SamplingParams(temperature=1.0, top_p=0.8), gen).tolist()) == {1, 3}
