"""Path likelihood as a value: how probable the model found the path so far (no model call).

The score of a node is the geometric mean of the probabilities of every token below the prompt on
its path, ``exp(mean log-prob)``, in (0, 1]: states the model finds natural rank first, whatever
their length. A finished path is scored like the LLM value verifier scores it: by the task's value
prompt's ``finished_score`` when the task knows one (Game of 24: the exact check of the final
expression), else by its likelihood.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from arbor_runtime.tasks.base import Problem, StepResult
from arbor_runtime.verifiers.base import Scale, Verifier

if TYPE_CHECKING:
    from arbor_runtime import Node, Runtime
    from arbor_runtime.tasks.base import Task


class LikelihoodVerifier(Verifier):
    """Scores a node by its path's mean token probability (geometric), finished paths by the task."""

    name = "likelihood"
    scale = Scale(
        live=0.0,
        solution=1.0,
        meaning="exp(mean log-prob) of the path; a finished path the task checks: 1.0 solved, 0.0 wrong",
    )

    def __init__(self) -> None:
        self.task: Task | None = None

    def bind(self, runtime: Runtime, task: Task) -> None:
        """Remember the task (its value prompt knows finished paths); the runtime is not needed."""
        del runtime
        self.task = task

    def score(self, problem: Problem, result: StepResult) -> float:
        """Only a finished path with a known score can be valued without its node; otherwise ValueError."""
        finished = self._finished(problem, result)
        if finished is None:
            raise ValueError("verifier=likelihood scores nodes (their path's log-probs): call score_node")
        return finished

    def score_node(self, problem: Problem, result: StepResult, node: Node) -> float:
        """0.0 invalid; a finished path by the task when it knows; else exp(mean log-prob below the prompt)."""
        if not result.valid:
            return 0.0
        finished = self._finished(problem, result)
        return finished if finished is not None else path_likelihood(node)

    def describe(self, problem: Problem, result: StepResult) -> dict[str, Any]:
        return {}

    def _finished(self, problem: Problem, result: StepResult) -> float | None:
        prompt = self.task.value_prompt if self.task is not None else None
        if not (result.valid and result.terminal) or prompt is None:
            return None
        return prompt.finished_score(problem, result)


def path_likelihood(node: Node) -> float:
    """exp(mean log-prob) of every token on ``node``'s path below the root (1.0 for a root)."""
    logprobs = [lp for block in node.path()[1:] for lp in block.logprobs]
    return math.exp(math.fsum(logprobs) / len(logprobs)) if logprobs else 1.0
