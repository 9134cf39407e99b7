"""Answer-presence verifier for the math tasks: scores search nodes without looking at the reference.

Used during search, so it must not peek at ``problem.answer``: a finished path that states an
answer is worth more than one that ran out of steps without one, and open paths sit in between.
Correctness is checked only at evaluation (``Task.is_correct``): its scale declares no solution
score, so no search stops on it (controllers stop on a self-consistency vote instead).
"""

from __future__ import annotations

from typing import Any

from arbor_runtime.tasks.base import Problem, StepResult
from arbor_runtime.verifiers.base import Scale, Verifier

#: a terminal node that states an answer
ANSWERED_SCORE = 1.0
#: a node whose path is still open
OPEN_SCORE = 0.5
#: a terminal node without an answer (ran out of steps, or an answer marker with nothing usable)
NO_ANSWER_SCORE = 0.1


class AnswerVerifier(Verifier):
    """Scores 0.0 invalid, 1.0 terminal with an answer, 0.1 terminal without one, 0.5 open."""

    name = "answer_match"
    #: an answer's presence is not its correctness: no score is a solution (a search stops early
    #: only on a self-consistency vote)
    scale = Scale(
        live=OPEN_SCORE, meaning="1.0: states an answer (unchecked); 0.5: open; 0.1: finished without one; 0.0: invalid"
    )

    def score(self, problem: Problem, result: StepResult) -> float:
        """Value of a node from its validity, whether it is terminal, and whether it states an answer."""
        if not result.valid:
            return 0.0
        if not result.terminal:
            return OPEN_SCORE
        return ANSWERED_SCORE if result.answer is not None else NO_ANSWER_SCORE

    def describe(self, problem: Problem, result: StepResult) -> dict[str, Any]:
        """The stated answer of a terminal node, for logs."""
        if not (result.valid and result.terminal):
            return {}
        return {"answer": result.answer}
