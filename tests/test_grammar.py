"""Grammar-constrained sampling (llguidance): samples match, masks are per row, restarts reset, errors are clear."""

from __future__ import annotations

import re

import pytest

from arbor_runtime import Runtime, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPT = "Input: 4 5 6 10\nSteps:\n"
STEP = r"(4|5|6|10) [-+*/] (4|5|6|10) = -?[0-9]{1,3}(/[0-9]{1,2})? \(left"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_constrained_samples_always_match_the_regex(tiny, seed):
    rt = Runtime(tiny, seed=seed)
    params = SamplingParams(max_new_tokens=40, temperature=1.0, regex=STEP)
    kids = rt.expand(rt.new_tree(PROMPT), 6, params)
    assert [k.stop_reason for k in kids] == ["grammar"] * 6
    assert all(re.fullmatch(STEP, k.text) for k in kids), [k.text for k in kids]
    free = rt.expand(kids[0].parent, 6, SamplingParams(max_new_tokens=20, temperature=1.0))
    assert not any(re.fullmatch(STEP, k.text) for k in free)  # the random model alone writes noise


def test_lark_grammar_and_greedy(tiny):
    rt = Runtime(tiny)
    grammar = 'start: "The answer is " NUM ".\\n"\nNUM: /-?[0-9]{1,4}/'
    kids = rt.expand(rt.new_tree(PROMPT), 3, SamplingParams(max_new_tokens=30, temperature=0.0, grammar=grammar))
    assert all(re.fullmatch(r"The answer is -?[0-9]{1,4}\.\n", k.text) for k in kids)
    assert len({k.text for k in kids}) == 1  # greedy: every row takes the masked argmax


def test_a_grammar_that_allows_everything_samples_what_unconstrained_sampling_does(tiny):
    vocab = tiny.model.config.vocab_size
    base = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, stop_at_eos=False)
    anything = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, stop_at_eos=False,
                              grammar=f"start: <[0-{vocab - 1}]>*")  # fmt: skip
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    free, constrained = rt.expand(root, 4, base), rt.expand(root, 4, anything)
    assert [k.token_ids for k in constrained] == [k.token_ids for k in free]
    assert [k.logprobs for k in constrained] == [k.logprobs for k in free]


def test_each_request_samples_under_its_own_regex_and_restarts_reset_the_grammar(tiny):
    regexes = [r"(4|5) \+ (4|5) = [0-9]{1,2} \(left", r"(6|10) \* (6|10) = [0-9]{1,3} \(left"]
    params = [SamplingParams(max_new_tokens=24, temperature=1.0, top_k=20, seed=3, regex=r) for r in regexes]
    free = Runtime(tiny)
    root = free.new_tree(PROMPT)
    one_batch = free.expand_many([(root, 3), (root, 3)], params)
    for kids, regex in zip(one_batch, regexes, strict=True):
        assert all(re.fullmatch(regex, k.text) for k in kids)
    budget = root.length + 16  # rows grow past their first page: some are preempted and restart
    tight = Runtime(tiny, policy="arbor", budget_tokens=budget)
    split = tight.expand_many([(tight.new_tree(PROMPT), 3)] * 2, params)
    assert tight.metrics.preemptions > 0
    assert [[k.token_ids for k in g] for g in split] == [[k.token_ids for k in g] for g in one_batch]


def test_bad_grammar_input_is_one_clear_error(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    with pytest.raises(ValueError, match=r"regex='\(ab' does not compile: .*unclosed group"):
        rt.expand(root, 1, SamplingParams(regex="(ab"))
    with pytest.raises(ValueError, match="does not compile"):
        rt.expand(root, 1, SamplingParams(grammar="start: missing_rule"))
    with pytest.raises(ValueError, match="regex= or grammar=, not both"):
        SamplingParams(regex="a", grammar='start: "a"')
    with pytest.raises(ValueError, match="must be a non-empty string"):
        SamplingParams(regex="")
    with pytest.raises(ValueError, match="2 SamplingParams for 1 requests"):
        rt.expand_many([(root, 1)], [SamplingParams(), SamplingParams()])
    assert root.children == []  # nothing started
