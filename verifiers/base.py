"""Verifier interface: scores a node for the search controller.

Verifiers read only the task-neutral interface of :mod:`tasks.base` (the problem, the
:class:`~tasks.base.StepResult` of a thought, the task's declared value prompt) and leaf modules
such as :mod:`tasks.arith24`; they never import a task module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from tasks.base import Problem, StepResult

if TYPE_CHECKING:
    from arbor_runtime import Node, Runtime
    from tasks.base import Task


class Verifier(ABC):
    """Scores the state a thought leads to; higher is more promising. Scores are in [0, 1].

    ``name`` is the verifier's option in ``conf/verifier``; a task lists the names that fit it.
    """

    name: str = "verifier"
    #: how tables must qualify rows this verifier scored ("" for none; the oracle: "oracle (upper bound)")
    label: str = ""

    @abstractmethod
    def score(self, problem: Problem, result: StepResult) -> float:
        """Value of the node whose thought produced ``result`` (its ``state`` is after the thought)."""

    def score_node(self, problem: Problem, result: StepResult, node: Node) -> float:
        """Value of ``node``, the block ending the thought that produced ``result`` (controllers call
        this). By default the state alone decides (:meth:`score`); a verifier that reads the tree
        (the path's likelihood) overrides it."""
        del node
        return self.score(problem, result)

    def describe(self, problem: Problem, result: StepResult) -> dict[str, Any]:
        """Extra fields to log for a scored node (default: none)."""
        return {}

    def bind(self, runtime: Runtime, task: Task) -> None:
        """Called by a controller before it searches: the runtime it grows trees in and the task.

        Verifiers that need neither (symbolic checks) ignore it.
        """
        del runtime, task
