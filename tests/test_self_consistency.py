"""Self-consistency vote over the terminals a search saw (``SearchResult.extra``), beside the best terminal.

A scripted task makes every thought a finished path whose answer comes from a list in creation
order, and a scripted verifier scores answers from a table, so the tiny model's text cannot matter.
"""

from __future__ import annotations

import pytest

from arbor_runtime import Runtime
from arbor_runtime.controllers import BFSController, DFSController
from arbor_runtime.tasks.answers import gsm8k_match
from arbor_runtime.tasks.base import Problem, StepResult, Task
from arbor_runtime.verifiers.base import Verifier

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class AnswerListTask(Task):
    """Each thought ends the path with the next answer of ``answers`` (None: a path without an answer)."""

    name = "answer_list"
    max_thought_tokens = 4
    max_steps = 1

    def __init__(self, answers: list[str | None], gold: str = "18") -> None:
        self.answers, self.gold, self.count = answers, gold, 0

    def problems(self) -> list[Problem]:
        return [Problem(index=0, question="q", answer=self.gold)]

    def prompt(self, problem: Problem) -> str:
        return "Answer: "

    def initial_state(self, problem: Problem) -> str | None:
        return None

    def step(self, problem: Problem, state: str | None, thought: str) -> StepResult:
        self.count += 1
        answer = self.answers[self.count - 1]
        return StepResult(state=answer, terminal=True, answer=answer)

    def is_correct(self, problem: Problem, answer: str | None) -> bool:
        return answer is not None and self.answers_match(answer, problem.answer)


class NumericAnswerListTask(AnswerListTask):
    """The same, with numeric answer equivalence ("18.0" equals "18")."""

    def answers_match(self, pred: str, gold: str) -> bool:
        return gsm8k_match(pred, gold)


class AnswerScores(Verifier):
    """Scores a state (an answer) from a table, else 0.5."""

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table

    def score(self, problem: Problem, result: StepResult) -> float:
        return self.table.get(result.state, 0.5)


def solve_bfs(tiny, task: AnswerListTask, table: dict[str, float] | None = None):
    ctrl = BFSController(Runtime(tiny, seed=0), task, AnswerScores(table or {}), n_generate=len(task.answers))
    return ctrl.solve(task.problems()[0])


def test_majority_answer_is_voted_beside_the_best_terminal(tiny):
    result = solve_bfs(tiny, AnswerListTask(["18", "18", "20"]), {"20": 0.9})
    assert result.answer == "20" and not result.solved  # the best terminal is kept as it was
    assert result.extra == {"vote_answer": "18", "vote_count": 2, "vote_correct": True}


def test_vote_uses_the_tasks_answer_equivalence(tiny):
    numeric = solve_bfs(tiny, NumericAnswerListTask(["20", "18", "18.0"]))
    assert numeric.extra == {"vote_answer": "18", "vote_count": 2, "vote_correct": True}
    plain = solve_bfs(tiny, AnswerListTask(["20", "18", "18.0"]))  # string equality: a three-way tie
    assert plain.extra == {"vote_answer": "20", "vote_count": 1, "vote_correct": False}


def test_paths_without_an_answer_do_not_vote(tiny):
    assert solve_bfs(tiny, AnswerListTask([None, "20", None])).extra["vote_count"] == 1
    assert solve_bfs(tiny, AnswerListTask([None, None])).extra == {}


def test_terminals_reset_per_problem_and_controller_extras_are_kept(tiny):
    task = AnswerListTask(["18", "20", "20", "18", "18", "20"])
    ctrl = DFSController(Runtime(tiny, seed=0), task, AnswerScores({}), n_generate=3, max_visits=1)
    first = ctrl.solve(task.problems()[0])
    assert first.extra == {"vote_answer": "20", "vote_count": 2, "vote_correct": False, "backtracks": 0, "visits": 1}
    second = ctrl.solve(task.problems()[0])  # only this search's three terminals vote
    assert second.extra["vote_answer"] == "18" and second.extra["vote_count"] == 2 and second.extra["vote_correct"]
    assert len(ctrl.terminals) == 3


def test_verifier_bind_is_called_with_the_runtime_and_task(tiny):
    class Binding(AnswerScores):
        def bind(self, runtime: Runtime, task: Task) -> None:
            self.bound = (runtime, task)

    rt, verifier, task = Runtime(tiny, seed=0), Binding({}), AnswerListTask(["18"])
    BFSController(rt, task, verifier)
    assert verifier.bound[0] is rt and verifier.bound[1] is task
