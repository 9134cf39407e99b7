"""Faithful search (issue 15): duplicates dropped, dead branches released after every step,
thresholds on the verifier's declared scale, no early stop on an unverified answer, beam and MCTS
details, model-call limits.

Scripted tasks and verifiers (see tests/test_controllers.py) make every search deterministic on the
tiny random model: thoughts are numbered in creation order and scored from tables.
"""

from __future__ import annotations

from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_controllers import CONTROLLERS, NumberedTask, ScriptedVerifier

from arbor_runtime import Runtime
from arbor_runtime.controllers import Candidate, Controller
from arbor_runtime.tasks.base import Problem, StepResult, ValuePrompt, ValueQuery
from arbor_runtime.tasks.game24 import Game24Task
from arbor_runtime.tasks.stepwise import StepwiseState, StepwiseTask
from arbor_runtime.verifiers.answer_match import AnswerVerifier
from arbor_runtime.verifiers.base import Scale, charge_model_call
from arbor_runtime.verifiers.game24_oracle import Game24OracleVerifier
from arbor_runtime.verifiers.llm_value import MAX_VERDICT_VALUE, Evaluation, LLMValueVerifier, raw_value

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: search sizes that give every controller several steps on the numbered task
WIDE = {
    "bfs": {"n_generate": 3, "breadth": 2},
    "beam": {"beam_width": 2, "samples_per_node": 3},
    "dfs": {"n_generate": 3, "max_visits": 8, "value_threshold": 0.3},
    "best_first": {"n_generate": 3, "max_expansions": 8},
    "mcts": {"n_generate": 3, "iterations": 12},
}
#: every controller, and MCTS with rollouts: (config name, options)
SEARCHES = [(name, WIDE[name]) for name in sorted(WIDE)] + [("mcts", {**WIDE["mcts"], "rollout": True})]
#: scores spread over [0, 1) by thought number: pruning, ranking and backtracking all happen
SPREAD = {i: (i * 37 % 100) / 100 for i in range(1, 500)}


class AliasTask(NumberedTask):
    """The numbered task whose state identity is the depth and a label of the newest thought
    (``alias`` maps thought numbers to labels): thoughts with one label at one depth are duplicates."""

    def __init__(self, alias, **kwargs) -> None:
        super().__init__(**kwargs)
        self.alias = alias

    def state_key(self, state: tuple[int, ...]) -> Hashable:
        return (len(state), self.alias(state[-1])) if state else ()


class ChargingVerifier(ScriptedVerifier):
    """A scripted verifier that asks "the model" once per state, as an LLM value verifier does."""

    max_calls_per_score = 1

    def score(self, problem: Problem, result: StepResult) -> float:
        charge_model_call(result.state)
        return super().score(problem, result)


def search(name: str, tiny, task, verifier, **options) -> tuple[Controller, Runtime]:
    rt = Runtime(tiny, seed=0)
    return CONTROLLERS[name](rt, task, verifier, **options), rt


def state_of(cand: Candidate | None):
    return None if cand is None else cand.node.meta["state"]


# ---- 1. duplicates -----------------------------------------------------------------------------
def test_bfs_drops_repeated_states_before_ranking(tiny):
    # the root samples A, A, B, A, C (thoughts 1-5; 2 and 4 repeat 1's state); the repeats would
    # score best, but only the first A is kept: the frontier is A, C, B, not A, A, A.
    task = AliasTask(lambda i: {2: 1, 4: 1}.get(i, i), max_steps=2)
    scores = {1: 0.5, 2: 0.9, 3: 0.3, 4: 0.8, 5: 0.4}
    ctrl, rt = search("bfs", tiny, task, ScriptedVerifier(scores, 0.2), n_generate=5, breadth=3)
    seen = []
    expand = ctrl.expand
    ctrl.expand = lambda requests, *a, **k: (
        seen.append([c.node.meta["state"] for c in ctrl.frontier()]) or expand(requests, *a, **k)
    )
    result = ctrl.solve(task.problems()[0])
    assert seen[1] == [(1,), (5,), (3,)]  # the second level expands one node per distinct state
    assert result.duplicates_dropped == 2 and ctrl.counts()["duplicates_dropped"] == 2
    dups = [n for n in rt.all_nodes.values() if n.meta.get("duplicate")]
    assert sorted(n.meta["state"] for n in dups) == [(2,), (4,)] and all(n.released for n in dups)
    assert all(n.value is None for n in dups)  # dropped before the verifier scored them


@pytest.mark.parametrize("name", sorted(WIDE))
def test_no_state_is_kept_or_expanded_twice(name, tiny):
    task = AliasTask(lambda i: i % 3, max_steps=3)  # three labels per depth: states repeat often
    ctrl, rt = search(name, tiny, task, ScriptedVerifier(SPREAD, 0.5), **WIDE[name])
    result = ctrl.solve(task.problems()[0])
    assert result.duplicates_dropped > 0
    dups = [n for n in rt.all_nodes.values() if n.meta.get("duplicate")]
    assert len(dups) == result.duplicates_dropped and all(n.released for n in dups)
    scored = [n for n in rt.all_nodes.values() if n.value is not None and n.meta["valid"]]
    keys = [task.state_key(n.meta["state"]) for n in scored]
    assert len(keys) == len(set(keys))  # every scored candidate is a new state
    expanded = [task.state_key(rt.all_nodes[i].meta["state"]) for i in result.expansions]
    assert len(expanded) == len(set(expanded))


def test_tasks_define_state_identity(data_dir):
    game24 = Game24Task(data_dir=str(data_dir), start=900, end=901)
    problem = Problem(index=0, question="1 2 3 4")
    start = game24.initial_state(problem)
    a, b = (game24.step(problem, start, step).state for step in ("1 * 4 = 4", "4 / 1 = 4"))
    assert game24.state_key(a) == game24.state_key(b) and a.remaining != b.remaining  # same numbers left
    assert game24.state_key(a) != game24.state_key(game24.step(problem, start, "1 + 4 = 5").state)
    gsm8k = StepwiseTask(
        "gsm8k", {"folder": "gsm8k", "files": {"test": "test.jsonl"}}, "number", "Solve.", data_dir=str(data_dir)
    )
    one, two = StepwiseState(("He has  5 apples.",)), StepwiseState(("he has 5 apples.",))
    assert gsm8k.state_key(one) == gsm8k.state_key(two) != gsm8k.state_key(StepwiseState(("He has 6 apples.",)))
    assert NumberedTask().state_key((1, 2)) is None  # the default: no identity, nothing deduplicated


# ---- 2. dead branches --------------------------------------------------------------------------
def dead_nodes(ctrl: Controller) -> list[int]:
    """Resident nodes of the search tree with no descendant in the frontier or on the best path."""
    live = {n.id for c in [*ctrl.frontier(), ctrl.best] if c is not None for n in c.node.path()}
    return [n.id for n in ctrl.root.subtree() if not n.released and n.id not in live]


@pytest.mark.parametrize(("name", "options"), SEARCHES)
def test_no_dead_branch_is_resident_after_any_step(name, options, tiny):
    task = NumberedTask(max_steps=3)
    ctrl, rt = search(name, tiny, task, ScriptedVerifier(SPREAD, 0.5), **options)
    checks = []
    expand = ctrl.expand

    def checked(requests, *args, **kwargs):
        live = {n.id for c in ctrl.frontier() for n in c.node.path()}
        assert all(node.id in live for node, _ in requests)  # what grows comes from the frontier
        assert dead_nodes(ctrl) == []
        checks.append(len(ctrl.frontier()))
        return expand(requests, *args, **kwargs)

    ctrl.expand = checked
    ctrl.solve(task.problems()[0])
    assert len(checks) >= 3 and dead_nodes(ctrl) == []  # after the last step too
    assert rt.metrics.nodes_released > 0
    width = {"bfs": WIDE["bfs"]["breadth"], "beam": WIDE["beam"]["beam_width"] + 1}.get(name)
    assert width is None or max(checks) <= width  # the frontier is what the search keeps, no more


@pytest.mark.parametrize("name", ["bfs", "beam"])
def test_a_replaced_best_answer_is_released(name, tiny):
    # root -> 1 (0.9), 2 (finished, 0.4), 3 (0.5): 2 is the best answer; 1 -> 4, 5 (finished, 0.7),
    # 6 and 3 -> 7, 8, 9: 5 beats 2, so 2 can never be used again and is released.
    task = NumberedTask(max_steps=3, ends=frozenset({2, 5}))
    scores = {1: 0.9, 2: 0.4, 3: 0.5, 5: 0.7}
    size = {"n_generate": 3, "breadth": 2} if name == "bfs" else {"samples_per_node": 3, "beam_width": 2}
    ctrl, rt = search(name, tiny, task, ScriptedVerifier(scores, 0.1), **size)
    result = ctrl.solve(task.problems()[0])
    assert result.best.meta["state"] == (1, 5) and not result.best.released
    assert next(n for n in rt.all_nodes.values() if n.meta.get("state") == (2,)).released


# ---- 3. thresholds on the verifier's scale -----------------------------------------------------
class NumberedValuePrompt(ValuePrompt):
    """A value prompt keyed by the path of thought numbers."""

    prefix = "Judge: "

    def query(self, problem: Problem, state: tuple[int, ...]) -> ValueQuery:
        return ValueQuery(state, f"{state}")


class ScriptedLLMValue(LLMValueVerifier):
    """``llm_value`` with its real scale and scoring, verdicts from a table by the newest thought
    number instead of the model (default: three "likely")."""

    def __init__(self, verdicts: dict[int, tuple[str, ...]] | None = None) -> None:
        super().__init__(n_evaluate=3, prompt=NumberedValuePrompt())
        self.verdicts = verdicts or {}

    def bind(self, runtime: Runtime, task) -> None:
        self.use_runtime(runtime)

    def evaluate(self, query: ValueQuery) -> Evaluation:
        charge_model_call(query.key)
        verdicts = self.verdicts.get(query.key[-1], ("likely",) * 3)
        raw = raw_value(list(verdicts))
        return Evaluation(verdicts, raw, raw / (MAX_VERDICT_VALUE * self.n_evaluate))


def test_verifiers_declare_their_scale():
    assert Game24OracleVerifier.scale.verifies and Game24OracleVerifier.scale.live == 1.0
    assert not AnswerVerifier.scale.verifies and AnswerVerifier.scale.live == 0.5
    assert LLMValueVerifier.scale.verifies and LLMValueVerifier.scale.live == pytest.approx(1 / 20)
    assert LLMValueVerifier.max_calls_per_score == 1 and Game24OracleVerifier.max_calls_per_score == 0
    with pytest.raises(ValueError, match="live=2"):
        Scale(live=2.0)


def test_dfs_with_llm_value_explores_past_the_root(tiny):
    # every state is judged "likely" three times (0.05): DFS's default threshold, the verifier's
    # "live" level, keeps them; the old fixed 0.5 pruned every child of the root.
    task = NumberedTask(max_steps=3)
    ctrl, _ = search("dfs", tiny, task, ScriptedLLMValue(), n_generate=2, max_visits=5)
    assert ctrl.value_threshold == pytest.approx(0.05)
    result = ctrl.solve(task.problems()[0])
    assert result.extra["visits"] == 5 and max(len(s) for s in _expanded(ctrl, result)) == 2
    fixed, _ = search("dfs", tiny, NumberedTask(max_steps=3), ScriptedLLMValue(), n_generate=2, value_threshold=0.5)
    assert fixed.solve(fixed.task.problems()[0]).extra["visits"] == 1


def test_dfs_prunes_states_judged_below_likely(tiny):
    # thought 1 is judged likely, likely, impossible (below a mean of "likely"): only 2 is visited
    verdicts = {1: ("likely", "likely", "impossible")}
    ctrl, _ = search("dfs", tiny, NumberedTask(max_steps=2), ScriptedLLMValue(verdicts), n_generate=2, max_visits=5)
    result = ctrl.solve(ctrl.task.problems()[0])
    assert _expanded(ctrl, result) == [(), (2,)]


def _expanded(ctrl: Controller, result) -> list[tuple[int, ...]]:
    return [ctrl.rt.all_nodes[i].meta["state"] for i in result.expansions]


# ---- 4. no early stop on an unverified answer --------------------------------------------------
class AnsweringTask(NumberedTask):
    """Two steps per path; a finished path states the answer ``answers`` gives its last thought."""

    def __init__(self, answers: dict[int, str]) -> None:
        super().__init__(max_steps=2)
        self.answers = answers

    def step(self, problem: Problem, state: tuple[int, ...], thought: str) -> StepResult:
        result = super().step(problem, state, thought)
        answer = self.answers.get(result.state[-1], f"x{result.state[-1]}") if result.terminal else None
        return StepResult(state=result.state, terminal=result.terminal, answer=answer)


@pytest.mark.parametrize(("quorum", "visits"), [(3, 4), (2, 3), (0, 4)])
def test_answer_presence_does_not_stop_a_search_a_vote_does(quorum, visits, tiny):
    # root -> three open thoughts (0.5); the first visited -> 4 "7", 5 "8", 6 "9"; the second ->
    # 7 "7", 8, 9 (other answers); the third -> 10 "7", 11, 12. Every stated answer scores 1.0
    # under answer_match; stopping there would end after 2 visits. A quorum of 2 stops after 3.
    task = AnsweringTask({4: "7", 5: "8", 6: "9", 7: "7", 10: "7"})
    ctrl, _ = search("dfs", tiny, task, AnswerVerifier(), n_generate=3, vote_quorum=quorum, max_visits=4)
    result = ctrl.solve(task.problems()[0])
    assert result.extra["visits"] == visits
    assert result.extra["vote_answer"] == "7" and result.extra["vote_count"] == min(visits - 1, 3)


def test_a_verifying_verifier_still_stops_at_its_solution_score(tiny):
    task = AnsweringTask({})
    verifier = ScriptedVerifier({}, 0.5, terminal=1.0)  # declares solution=1.0
    ctrl, _ = search("dfs", tiny, task, verifier, n_generate=3, max_visits=4)
    assert ctrl.solve(task.problems()[0]).extra["visits"] == 2


# ---- 5. MCTS values, call limits ---------------------------------------------------------------
def test_mcts_values_siblings_alike(tiny):
    # root -> 1 (0.9), 2 (0.3); 2's children would score 0.95, but 2 is valued by its own score on
    # its first visit, as 1 was (before, 2 got its best child's score and 1 its own)
    scores = {1: 0.9, 2: 0.3, 3: 0.95, 4: 0.95}
    ctrl, _ = search("mcts", tiny, NumberedTask(), ScriptedVerifier(scores, 0.5), n_generate=2, iterations=2)
    result = ctrl.solve(ctrl.task.problems()[0])
    root, (one, two) = result.expansions[0], result.extra["tree"][result.expansions[0]]
    assert result.extra["values"] == {root: pytest.approx(1.2), one: 0.9, two: 0.3}
    ctrl, rt = search("mcts", tiny, NumberedTask(), ScriptedVerifier(SPREAD, 0.5), n_generate=2, iterations=12)
    result = ctrl.solve(ctrl.task.problems()[0])
    firsts = [n for n, v in result.extra["visits"].items() if v == 1 and n != root]
    assert len(firsts) > 3 and all(result.extra["values"][n] == rt.all_nodes[n].value for n in firsts)


@pytest.mark.parametrize(("name", "options"), SEARCHES)
@pytest.mark.parametrize("limit", [1, 4, 9])
def test_model_call_limits_hold(name, options, limit, tiny):
    task = NumberedTask(max_steps=3)
    big = {**options, **{k: 50 for k in ("max_visits", "max_expansions", "iterations") if k in options}}
    ctrl, _ = search(name, tiny, task, ChargingVerifier(SPREAD, 0.5), max_model_calls=limit, **big)
    result = ctrl.solve(task.problems()[0])
    assert result.model_calls == result.generation_calls + result.verifier_calls <= limit
    assert result.verifier_calls == len(ctrl.verifier_keys) and ctrl.counts()["model_calls"] == result.model_calls
    n = big.get("n_generate", big.get("samples_per_node"))
    assert result.generation_calls == (0 if limit < 1 + n else len(result.expansions))
    if limit == 9:  # it stopped at the limit: one more expansion would not have fit
        assert result.model_calls > limit - (1 + n * ctrl.verifier.max_calls_per_score)


def test_calls_are_charged_per_search_when_searches_share_a_verifier(tiny):
    rt, verifier = Runtime(tiny, seed=0), ChargingVerifier(SPREAD, 0.5)

    def one(_):
        task = NumberedTask(max_steps=2)
        return CONTROLLERS["bfs"](rt, task, verifier, n_generate=2, breadth=2).solve(task.problems()[0])

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, range(3)))
    assert [r.verifier_calls for r in results] == [6, 6, 6]  # 2 + 4 states each, none charged to another
