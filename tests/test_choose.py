"""rt.choose: k continuations scored in one forward over the shared path, optionally kept as children."""

from __future__ import annotations

import math

import pytest
import torch
from floats import reassociation_tol

from arbor_runtime import KVBudgetExceeded, Runtime, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPT = "Input: 4 5 6 10\nSteps:\n"
CHOICES = ["4 + 6 = 10 (left: 5 10 10)\n", "10 - 4 = 6 (left: 5 6 6)\n", "5 * 6 = 30 (left: 4 10 30)\n", " sure"]


def appended(rt: Runtime, node, texts):
    """Each text appended one by one (the reference), released again."""
    out = []
    for text in texts:
        child = rt.append(node, text)
        out.append(list(child.logprobs))
        rt.release(child)
    return out


@pytest.mark.parametrize("spec", ["tiny", "smollm2"])
def test_choose_logprobs_equal_append_one_by_one(spec, request):
    loaded = request.getfixturevalue(spec)
    rt = Runtime(loaded)
    root = rt.new_tree(PROMPT)
    node = rt.append(root, "4 + 5 = 9 (left: 6 9 10)\n")  # a deeper node: the path has two blocks
    got = rt.choose(node, CHOICES)
    want = appended(rt, node, CHOICES)
    for lp, ref in zip(got.token_logprobs, want, strict=True):
        assert len(lp) == len(ref)
        assert max(abs(a - b) for a, b in zip(lp, ref, strict=True)) <= reassociation_tol(loaded, ref)
    assert got.total == [math.fsum(lp) for lp in got.token_logprobs]
    assert got.mean == [t / len(lp) for t, lp in zip(got.total, got.token_logprobs, strict=True)]
    assert math.isclose(sum(got.probs_sum), 1.0) and math.isclose(sum(got.probs_mean), 1.0)
    assert got.order == sorted(range(4), key=lambda i: -got.total[i]) and got.kept == []


def test_one_token_choices_are_the_parents_next_token_distribution(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    words = [" sure", " likely", " no", " yes", "4", "\n"]
    ids = [rt.tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
    assert all(len(i) == 1 for i in ids)
    calls = rt.backend.forward_calls
    got = rt.choose(root, words)
    assert rt.backend.forward_calls == calls  # nothing to forward: the parent's stored logits suffice
    logp = rt.next_token_logprobs(root)
    assert got.total == [float(logp[i[0]]) for i in ids]
    p = logp.exp()[[i[0] for i in ids]].double()
    assert torch.allclose(torch.tensor(got.probs_sum, dtype=torch.float64), p / p.sum(), rtol=1e-6)
    assert got.probs_mean == got.probs_sum  # one token each: sum and mean rank alike


def test_choices_read_the_path_once_in_one_forward(tiny, monkeypatch):
    rt = Runtime(tiny)
    node = rt.append(rt.new_tree(PROMPT), "4 + 5 = 9 (left: 6 9 10)\n")
    seen = []
    batch = rt.runner.batch

    def spy(contexts, q, write, stats):
        made = batch(contexts, q, write, stats)
        seen.append(made)
        return made

    monkeypatch.setattr(rt.runner, "batch", spy)
    calls = rt.backend.forward_calls
    rt.choose(node, CHOICES)
    assert rt.backend.forward_calls == calls + 1 and len(seen) == 1
    (made,) = seen
    assert made.rows == len(CHOICES) and made.q == max(len(rt.tokenizer(c)["input_ids"]) for c in CHOICES)
    assert [g.block_id for g in made.groups] == [n.id for n in node.path()]
    assert all(g.rows is None for g in made.groups)  # one group per block, shared by every row
    assert made._write_slots.numel() == 0  # nothing kept: no KV stored, padded positions included
    assert rt.metrics.scored_tokens == sum(len(rt.tokenizer(c)["input_ids"]) for c in CHOICES)


def test_kept_choices_are_blocks_like_appended_ones(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    before = rt.metrics.prefill_tokens
    got = rt.choose(root, CHOICES, keep=2)
    assert got.kept_index == got.order[:2] and [c.text for c in got.kept] == [CHOICES[i] for i in got.order[:2]]
    assert all(c.parent is root and c.kind == "forced" and c in root.children for c in got.kept)
    assert rt.metrics.prefill_tokens - before == sum(c.length for c in got.kept)
    ref = Runtime(tiny)
    ref_root = ref.new_tree(PROMPT)
    for child in got.kept:
        twin = ref.append(ref_root, child.text)
        tol = reassociation_tol(tiny, twin.logprobs)
        assert max(abs(a - b) for a, b in zip(child.logprobs, twin.logprobs, strict=True)) <= tol
        diff = (rt.next_token_logprobs(child) - ref.next_token_logprobs(twin)).abs().max()
        assert float(diff) <= reassociation_tol(tiny, [float(ref.next_token_logprobs(twin).abs().max())])
        # the stored KV serves children: greedy continuations agree
        params = SamplingParams(max_new_tokens=5, temperature=0.0)
        assert rt.expand(child, 1, params)[0].token_ids == ref.expand(twin, 1, params)[0].token_ids
    picked = rt.choose(root, CHOICES, keep=[3, 0])
    assert picked.kept_index == [3, 0] and [c.text for c in picked.kept] == [CHOICES[3], CHOICES[0]]
    assert [op["op"] for op in rt.oplog[-2:]] == ["append", "append"]


def test_kept_choices_need_room_under_a_budget(tiny):
    probe = Runtime(tiny)
    root_len = probe.new_tree(PROMPT).length
    longest = max(len(probe.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in CHOICES)
    rt = Runtime(tiny, policy="full", budget_tokens=root_len + longest)
    root = rt.new_tree(PROMPT)
    rt.choose(root, CHOICES)  # scoring only: no slots needed beyond the path
    assert len(rt.choose(root, CHOICES, keep=1).kept) == 1
    with pytest.raises(KVBudgetExceeded, match="during choose"):
        rt.choose(root, CHOICES, keep=[0, 1, 2])
    assert rt.metrics.peak_device_tokens <= root_len + longest


@pytest.mark.parametrize(
    ("choices", "kwargs", "message"),
    [
        ([], {}, "non-empty list of choices"),
        ("sure", {}, "non-empty list of choices"),
        ([" a", " a"], {}, "given twice"),
        ([" a", ""], {}, "tokenizes to nothing"),
        ([" a", " b"], {"keep": 3}, r"keep=3 must be in 0..2"),
        ([" a", " b"], {"keep": [2]}, "choice indices in 0..1"),
        ([" a", " b"], {"keep": [0, 0]}, "names a choice twice"),
        ([" a", " b"], {"by": "max"}, "by='max' must be one of sum, mean"),
    ],
)
def test_bad_choose_input_is_one_clear_error(tiny, choices, kwargs, message):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    with pytest.raises(ValueError, match=message):
        rt.choose(root, choices, **kwargs)


def test_choose_on_a_released_node_is_an_error(tiny):
    rt = Runtime(tiny)
    child = rt.append(rt.new_tree(PROMPT), "4 + 5 = 9\n")
    rt.release(child)
    with pytest.raises(ValueError, match="was released"):
        rt.choose(child, [" a", " b"])


def test_arbor_stores_kept_choices_one_at_a_time_when_they_do_not_fit_together(tiny):
    """Path + one choice fits, path + all kept choices does not: arbor splits the pass (earlier
    kept choices leave the device) and the kept children equal those of an unbudgeted run."""
    ref = Runtime(tiny, policy="full")
    ref_root = ref.new_tree(PROMPT)
    want = ref.choose(ref_root, CHOICES, keep=3)
    lengths = [len(c.token_ids) for c in want.kept]
    budget = ref_root.length + max(lengths) + 4  # and room for 4 new tokens below a kept choice
    assert budget < ref_root.length + sum(lengths)  # together they do not fit
    rt = Runtime(tiny, policy="arbor", budget_tokens=budget)
    root = rt.new_tree(PROMPT)
    got = rt.choose(root, CHOICES, keep=3)
    assert got.kept_index == want.kept_index and [c.token_ids for c in got.kept] == [c.token_ids for c in want.kept]
    tol = reassociation_tol(tiny, got.total)
    assert all(math.isclose(a, b, abs_tol=tol) for a, b in zip(got.total, want.total, strict=True))
    for g, w in zip(got.kept, want.kept, strict=True):
        assert all(math.isclose(a, b, abs_tol=tol) for a, b in zip(g.logprobs, w.logprobs, strict=True))
    assert rt.metrics.peak_device_tokens <= budget and rt.metrics.evicted_tokens > 0
    params = SamplingParams(max_new_tokens=4, temperature=0.0)  # the evicted children come back exact
    for g, w in zip(got.kept, want.kept, strict=True):
        assert rt.expand(g, 1, params)[0].token_ids == ref.expand(w, 1, params)[0].token_ids


def test_naive_tot_runtime_scores_choices_as_the_runtime_does(tiny):
    from benchmarks.naive import NaiveRuntime

    rt, naive = Runtime(tiny), NaiveRuntime(tiny)
    got, want = naive.choose(naive.new_tree(PROMPT), CHOICES, keep=2), rt.choose(rt.new_tree(PROMPT), CHOICES, keep=2)
    tol = reassociation_tol(tiny, want.total)
    assert all(math.isclose(a, b, abs_tol=tol) for a, b in zip(got.total, want.total, strict=True))
    assert got.kept_index == want.kept_index and [c.token_ids for c in got.kept] == [c.token_ids for c in want.kept]
    assert naive.metrics.forward_calls == len(CHOICES)  # one request per choice, the path re-sent each time
