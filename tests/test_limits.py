"""What a caller may ask is bounded (issue 47): sampling parameters are checked once and cannot change,
no block decodes past the model's positions, ``n`` has a cap, and a tiny budget cannot silently drop a
whole prompt. Each test reproduces a probe that misbehaved before."""

from __future__ import annotations

import dataclasses
import math

import pytest

from arbor_runtime import BudgetError, Runtime, SamplingParams
from arbor_runtime.engine.scheduler import PAGE
from arbor_runtime.validation import MAX_ROWS

PROMPT = "Input: 4 4 6 8\nSteps:\n"


@pytest.fixture(autouse=True)
def _threads(one_torch_thread):
    yield


def test_sampling_params_cannot_change_after_they_are_checked():
    """Before: ``p.temperature = nan`` after construction gave degenerate text; ``p.max_new_tokens = -3``
    an IndexError deep in the engine."""
    p = SamplingParams(max_new_tokens=10)
    for name, value in (("temperature", math.nan), ("top_p", 0), ("max_new_tokens", -3), ("stop", [1])):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(p, name, value)
    assert (p.temperature, p.top_p, p.max_new_tokens, p.stop) == (0.7, 1.0, 10, ())
    with pytest.raises(ValueError, match="temperature=nan"):
        dataclasses.replace(p, temperature=math.nan)  # a changed copy is checked again
    assert dataclasses.replace(p, temperature=0.0).greedy


@pytest.mark.parametrize("stop", [[1], None, ["\n", b"x"], 3])
def test_stop_must_be_strings_one_clear_error(stop):
    """Before: ``stop=[1]`` and ``stop=None`` were accepted and failed inside ``expand`` with a bare TypeError."""
    with pytest.raises(ValueError, match=r"^stop=.*(must be|is not) a string"):
        SamplingParams(stop=stop)


def test_stop_strings_are_a_tuple_without_empties():
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "", "b"]).stop == ("a", "b")
    assert SamplingParams(stop=("x",)).stop == ("x",)
    assert SamplingParams(stop="").stop == ()


def near_the_end(tiny, left: int) -> tuple[Runtime, object]:
    """A runtime whose root prompt leaves ``left`` positions of the tiny model's 4,096."""
    rt = Runtime(tiny, seed=0)
    limit = tiny.model.config.max_position_embeddings
    assert rt.max_positions == limit == 4096
    ids = rt.tokenizer(PROMPT * 400)["input_ids"][: limit - left]
    return rt, rt.new_tree_ids(ids)


def test_a_row_stops_at_the_models_last_position(tiny):
    """Before: ``max_new_tokens=5000, stop_at_eos=False`` returned 5,000 tokens past the tiny model's
    4,096 positions; ``max_new_tokens=10**9`` ran for minutes with memory rising."""
    rt, root = near_the_end(tiny, left=12)
    params = SamplingParams(max_new_tokens=10**9, temperature=1.0, seed=0, stop_at_eos=False)
    kids = rt.expand(root, 2, params)
    assert [k.length for k in kids] == [12, 12]
    assert [k.stop_reason for k in kids] == ["length", "length"]
    assert all(k.end_pos == rt.max_positions for k in kids)
    before = rt._next_id
    with pytest.raises(ValueError, match="pass the model's 4096 positions"):
        rt.expand(kids[0], 1, params)  # no position left: refused up front, nothing made
    assert rt._next_id == before
    with pytest.raises(ValueError, match="pass the model's 4096 positions"):
        rt.append_ids(root, [5] * 13)
    assert rt.append_ids(root, [5] * 12).end_pos == rt.max_positions


def test_a_prompt_past_the_models_positions_is_refused(tiny):
    rt = Runtime(tiny)
    with pytest.raises(ValueError, match="new_tree: the prompt: 4097 token"):
        rt.new_tree_ids([5] * 4097)
    assert rt.store.pool.used == 0 and not rt.nodes


def test_n_is_bounded_before_anything_runs(tiny):
    """Before: ``n=10**6`` was accepted (a million rows made up front)."""
    rt = Runtime(tiny)
    root = rt.new_tree(PROMPT)
    before = rt._next_id
    with pytest.raises(ValueError, match=f"n=1000000 .*at most {MAX_ROWS} children"):
        rt.expand(root, 10**6)
    with pytest.raises(ValueError, match=f"{MAX_ROWS + 2} children in all"):
        rt.expand_many([(root, MAX_ROWS // 2 + 1), (root, MAX_ROWS // 2 + 1)])
    assert rt._next_id == before and not root.children


@pytest.mark.parametrize("policy", ["h2o", "streaming", "snapkv", "thinkv", "kvp"])
def test_a_budget_that_would_drop_the_whole_prompt_is_refused(tiny, policy):
    """Before: h2o with ``budget_tokens=1`` accepted a 14-token prompt keeping none of it on the device."""
    rt = Runtime(tiny, policy=policy, budget_tokens=PAGE)
    with pytest.raises(BudgetError, match=f"budget_tokens={PAGE} .*at least {PAGE + 1}"):
        rt.new_tree(PROMPT)
    assert rt.store.pool.used == 0 and not rt.nodes
    rt = Runtime(tiny, policy=policy, budget_tokens=PAGE + 1)
    root = rt.new_tree(PROMPT)
    assert rt.residency(root)["device"] >= 1  # the smallest budget allowed keeps some of the prompt
    small = Runtime(tiny, policy=policy, budget_tokens=PAGE)
    assert small.new_tree("Hi").length <= PAGE  # a prompt the budget holds whole is fine
