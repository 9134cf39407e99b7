"""LLM value verifier: one prefilled value prefix per runtime, n_evaluate samples, ToT scoring, cache, BFS.

Verdict texts are scripted where the score matters (the tiny random model writes noise); token
accounting and the tree shape come from the real runtime.
"""

from __future__ import annotations

import math

import pytest
from hydra.utils import instantiate

from arbor_cli.build import compose_config
from arbor_runtime import Runtime
from arbor_runtime.controllers import BFSController
from arbor_runtime.tasks.base import Problem, StepResult
from arbor_runtime.tasks.game24 import Game24Task
from arbor_runtime.tasks.game24 import value_query as game24_query
from arbor_runtime.tasks.stepwise import StepwiseState, StepwiseValuePrompt
from arbor_runtime.tasks.stepwise import value_query as stepwise_query
from arbor_runtime.verifiers import LLMValueVerifier
from arbor_runtime.verifiers.llm_value import VALUE_MAP, parse_verdict, raw_value

pytestmark = pytest.mark.usefixtures("one_torch_thread")
GAME24_PREFIX = Game24Task.value_prompt.prefix
STEPWISE_PREFIX = StepwiseValuePrompt.prefix


@pytest.fixture
def game24() -> tuple[Game24Task, Problem]:
    task = Game24Task(start=900, end=901)  # the packaged puzzle file: rank 901
    return task, task.problems()[0]  # "4 5 6 10"


def after(task: Game24Task, problem: Problem, *thoughts: str) -> StepResult:
    """The step result of ``thoughts`` taken in order from the puzzle's start."""
    result = StepResult(state=task.initial_state(problem))
    for thought in thoughts:
        result = task.step(problem, result.state, thought)
    return result


def record_expands(rt: Runtime, texts: list[str] | None = None) -> list[int]:
    """Wrap ``rt.expand``; returns the list of ``n`` per call. With ``texts``, samples read as those texts."""
    calls: list[int] = []
    expand = rt.expand

    def fake(node, n=1, sampling=None):
        calls.append(n)
        kids = expand(node, n, sampling)
        for kid, text in zip(kids, texts or [], strict=False):
            kid.text = text
        return kids

    rt.expand = fake
    return calls


def n_tokens(rt: Runtime, text: str, special: bool) -> int:
    return len(rt.tokenizer(text, add_special_tokens=special)["input_ids"])


def test_parse_verdict_and_raw_value():
    assert parse_verdict(" sure\n") == "sure"
    assert parse_verdict(" Likely.") == "likely"
    assert parse_verdict("not sure... impossible") == "impossible"  # the last verdict word counts
    assert parse_verdict(" 24 maybe") is None and parse_verdict("") is None
    assert raw_value(["sure", "likely", "impossible", None]) == pytest.approx(21.001)
    assert raw_value([None, None]) == 0.0


def test_prefix_is_prefilled_once_for_many_states(tiny, game24):
    task, problem = game24
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(n_evaluate=3, max_new_tokens=8, mode="sample")
    verifier.bind(rt, task)
    calls = record_expands(rt)
    prefix_tokens = n_tokens(rt, GAME24_PREFIX, special=True)
    results = [after(task, problem, t) for t in ("4 + 5 = 9 (left", "6 - 4 = 2 (left", "10 * 6 = 60 (left")]
    grew = []
    for result in results:
        before = rt.metrics.prefill_tokens
        assert 0.0 <= verifier.score(problem, result) <= 1.0
        grew.append(rt.metrics.prefill_tokens - before)
    queries = [game24_query(" ".join(r.state.to_json()["left"])) for r in results]
    assert grew[0] == prefix_tokens + n_tokens(rt, queries[0], special=False)
    assert grew[1:] == [n_tokens(rt, q, special=False) for q in queries[1:]]  # the prefix is not prefilled again
    root = verifier.roots[GAME24_PREFIX]
    assert [n for n in rt.nodes.values() if n.parent is None] == [root]  # one value tree
    assert root.length == prefix_tokens and root.children == []  # every query and its samples released
    assert calls == [3, 3, 3] and verifier.evaluations == 3
    assert 0 < rt.metrics.decode_tokens <= 3 * 3 * 8


def test_score_is_tot_value_normalized(tiny, game24):
    task, problem = game24
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(n_evaluate=3, runtime=rt, prompt=task.value_prompt, mode="sample")
    record_expands(rt, [" sure\n", " likely\n", " 24 is out of reach"])
    result = after(task, problem, "4 + 5 = 9 (left")
    assert verifier.score(problem, result) == pytest.approx(21 / 60)  # (20 + 1 + 0) / (20 * n_evaluate)
    assert verifier.describe(problem, result) == {"value_raw": 21.0, "verdicts": ["sure", "likely", None]}
    record_expands(rt, [" impossible\n"] * 3)
    dead = after(task, problem, "4 * 5 = 20 (left")
    assert verifier.score(problem, dead) == pytest.approx(0.003 / 60)
    assert verifier.describe(problem, after(task, problem, "6 + 4 = 10 (left")) == {}  # not scored yet


def test_identical_states_are_evaluated_once(tiny, game24):
    task, problem = game24
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(n_evaluate=2, runtime=rt, prompt=task.value_prompt, mode="sample")
    calls = record_expands(rt)
    first = verifier.score(problem, after(task, problem, "4 + 5 = 9 (left"))
    prefill = rt.metrics.prefill_tokens
    assert verifier.score(problem, after(task, problem, "5 + 4 = 9 (left")) == first  # same numbers left
    assert calls == [2] and verifier.evaluations == 1 and rt.metrics.prefill_tokens == prefill
    other = Runtime(tiny, seed=0)
    verifier.bind(other, task)  # a new runtime (the CLI makes one per problem): new prefix root, empty cache
    assert verifier.cache == {} and verifier.roots == {}


def test_invalid_and_finished_paths_need_no_model(tiny, game24):
    task, problem = game24
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(runtime=rt, prompt=task.value_prompt)
    calls = record_expands(rt)
    invalid = after(task, problem, "7 + 7 = 14 (left")
    solved = after(task, problem, "10 - 6 = 4 (left", "4 * 5 = 20 (left", "20 + 4 = 24 (left")
    wrong = after(task, problem, "4 + 5 = 9 (left", "6 + 9 = 15 (left", "10 + 15 = 25 (left")
    assert not invalid.valid and solved.terminal and wrong.terminal
    assert verifier.score(problem, invalid) == 0.0
    assert verifier.score(problem, solved) == 1.0 and verifier.score(problem, wrong) == 0.0  # exact check
    stepwise = LLMValueVerifier(runtime=rt, prompt=StepwiseValuePrompt())
    no_answer = StepResult(state=StepwiseState(steps=("Half of 10 is 5.",)), terminal=True)
    assert stepwise.score(problem, no_answer) == 0.0
    assert calls == [] and not rt.nodes and rt.metrics.prefill_tokens == 0


def test_stepwise_states_use_their_own_prefix(tiny):
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(n_evaluate=2, runtime=rt, prompt=StepwiseValuePrompt(), mode="sample")
    record_expands(rt, [" likely\n", " sure\n"])
    problem = Problem(index=0, question="What is 3 + 4 * 2?", answer="11")
    result = StepResult(state=StepwiseState(steps=("4 * 2 = 8.",)))
    before = rt.metrics.prefill_tokens
    assert verifier.score(problem, result) == pytest.approx(21 / 40)
    query = stepwise_query(problem.question, ("4 * 2 = 8.",))
    assert query.endswith("Partial solution:\n4 * 2 = 8.\nJudgement:")
    assert rt.metrics.prefill_tokens - before == n_tokens(rt, STEPWISE_PREFIX, True) + n_tokens(rt, query, False)
    assert list(verifier.roots) == [STEPWISE_PREFIX]


def test_unbound_promptless_and_bad_arguments_are_clear(tiny, game24):
    task, problem = game24
    with pytest.raises(RuntimeError, match="bind"):
        LLMValueVerifier().score(problem, after(task, problem, "4 + 5 = 9 (left"))
    with pytest.raises(RuntimeError, match="bind"):
        LLMValueVerifier(prompt=task.value_prompt).score(problem, after(task, problem, "4 + 5 = 9 (left"))
    with pytest.raises(ValueError, match="n_evaluate=0"):
        LLMValueVerifier(n_evaluate=0)
    with pytest.raises(ValueError, match="mode='vote' must be one of choose, sample"):
        LLMValueVerifier(mode="vote")

    class NoValuePrompt(Game24Task):
        value_prompt = None
        verifiers = ("game24_oracle",)

    with pytest.raises(ValueError, match="task game24 has no value prompt; valid verifiers: game24_oracle"):
        LLMValueVerifier().bind(Runtime(tiny), NoValuePrompt(start=0, end=1))


class FixedStepGame24(Game24Task):
    """Game of 24 whose every thought is read as "a + b = a+b" of the two smallest numbers left."""

    def step(self, problem, state, thought):
        a, b = state.to_json()["left"][:2]
        return super().step(problem, state, f"{a} + {b} = {int(a) + int(b)} (left")


def test_bfs_on_game24_binds_and_uses_the_value_prefix(tiny):
    cfg = compose_config(["verifier=llm_value", "verifier.mode=sample", "controller=bfs"])
    verifier = instantiate(cfg.verifier)
    assert isinstance(verifier, LLMValueVerifier) and verifier.n_evaluate == 3 and verifier.runtime is None
    task = FixedStepGame24(start=900, end=901)
    rt = Runtime(tiny, seed=0)
    calls = record_expands(rt)
    ctrl = instantiate(cfg.controller, runtime=rt, task=task, verifier=verifier, n_generate=2, breadth=2)
    assert isinstance(ctrl, BFSController) and verifier.runtime is rt  # bound by the controller
    assert verifier.prompt is task.value_prompt
    result = ctrl.solve(task.problems()[0])
    # 4 5 6 10 -> (6 9 10) -> (10 15) -> 25: two distinct open states, each evaluated once
    assert verifier.evaluations == 2 and calls == [3, 3]
    assert result.steps == 3 and result.answer == "10 + (6 + (4 + 5))" and not result.solved
    # both thoughts of every level reach the same numbers: one is dropped, so one path is left
    assert result.duplicates_dropped == 3 and result.verifier_calls == 2
    assert result.extra == {"vote_answer": result.answer, "vote_count": 1, "vote_correct": False}
    assert result.best is not None and result.best.value == 0.0  # the exact check of the final state
    root = verifier.roots[GAME24_PREFIX]
    assert root.children == [] and root.id in rt.nodes  # only the prefix stays


def test_choose_mode_scores_the_verdict_probabilities_in_one_forward(tiny, game24):
    task, problem = game24
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(runtime=rt, prompt=task.value_prompt)  # mode="choose" is the default
    assert verifier.mode == "choose"
    calls = record_expands(rt)
    result = after(task, problem, "4 + 5 = 9 (left")
    verifier._root(GAME24_PREFIX)
    forwards = rt.backend.forward_calls
    score = verifier.score(problem, result)
    assert rt.backend.forward_calls == forwards + 1  # one forward: query + each verdict, three rows
    assert calls == [] and rt.metrics.decode_tokens == 0  # nothing sampled
    # the reference: the query appended, the three verdicts appended one by one
    ref = Runtime(tiny, seed=0)
    query = ref.append(ref.new_tree(GAME24_PREFIX), game24_query("6 9 10"))
    totals = {v: sum(ref.append(query, f" {v}").logprobs) for v in VALUE_MAP}
    z = sum(math.exp(t) for t in totals.values())
    probs = {v: math.exp(t) / z for v, t in totals.items()}
    described = verifier.describe(problem, result)
    assert described["verdict_probs"] == pytest.approx(probs, rel=1e-4)
    raw = sum(p * VALUE_MAP[v] for v, p in probs.items())
    assert described["value_raw"] == pytest.approx(raw, rel=1e-4) and score == pytest.approx(raw / 20, rel=1e-4)
    assert 0.001 / 20 <= score <= 1.0
    root = verifier.roots[GAME24_PREFIX]
    assert root.children == []  # the query was released; only the prefix stays
