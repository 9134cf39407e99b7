"""The exact Game of 24 solver as a verifier: an ORACLE, for upper-bound rows only.

It scores a state 1.0 iff 24 is still reachable from the numbers left (exact search in
:mod:`arbor_runtime.tasks.arith24`), so a search it steers is told the answer's existence at every step: its
accuracy is an upper bound on what a model-based value could reach, never a result of the model.
It is no task's default; every results row records its verifier and tables label this one
"oracle (upper bound)".

It reads a state only through :class:`NumbersLeft` (the numbers a path has left) and a terminal
result's stated answer (the final expression), so any task whose states carry exact numbers fits.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Protocol

from arbor_runtime.tasks.arith24 import check_expression, format_number, parse_puzzle, solvable
from arbor_runtime.tasks.base import Problem, StepResult
from arbor_runtime.verifiers.base import Scale, Verifier

#: score of a valid state that can no longer reach 24: low, but above an invalid thought's 0.0
DEAD_END_SCORE = 0.001


class NumbersLeft(Protocol):
    """What the verifier reads from a state: the numbers still to combine, exact."""

    @property
    def values(self) -> tuple[Fraction, ...]: ...


class Game24OracleVerifier(Verifier):
    """Scores Game of 24 nodes exactly: live paths 1.0, dead ends 0.001, invalid/wrong 0.0 (an oracle)."""

    name = "game24_oracle"
    label = "oracle (upper bound)"
    scale = Scale(
        live=1.0,
        solution=1.0,
        meaning="1.0: 24 still reachable (finished: solved); 0.001: dead end; 0.0: invalid or wrong",
    )

    def score(self, problem: Problem, result: StepResult) -> float:
        """Value of a node: 0.0 invalid; terminal 1.0 iff solved; else 1.0 iff 24 is still reachable."""
        if not result.valid:
            return 0.0
        if result.terminal:
            answer = result.answer
            return 1.0 if answer is not None and check_expression(answer, parse_puzzle(problem.question)) else 0.0
        state: NumbersLeft = result.state
        return 1.0 if solvable(state.values) else DEAD_END_SCORE

    def describe(self, problem: Problem, result: StepResult) -> dict[str, Any]:
        """The numbers left after the thought, for logs."""
        if not result.valid:
            return {}
        return {"left": [format_number(v) for v in result.state.values]}
