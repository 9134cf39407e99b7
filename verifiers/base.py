"""Verifier interface: scores a node for the search controller.

Verifiers read only the task-neutral interface of :mod:`arbor_runtime.tasks.base` (the problem, the
:class:`~arbor_runtime.tasks.base.StepResult` of a thought, the task's declared value prompt) and leaf modules
such as :mod:`arbor_runtime.tasks.arith24`; they never import a task module.

Every verifier declares its :class:`Scale` (what its scores mean: range, the "live" threshold,
and whether some score certifies a correct answer) and the most model calls one score may make;
controllers take their defaults from both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arbor_runtime.tasks.base import Problem, StepResult

if TYPE_CHECKING:
    from arbor_runtime import Node, Runtime
    from arbor_runtime.tasks.base import Task


@dataclass(frozen=True, slots=True)
class Scale:
    """What a verifier's scores mean.

    Attributes:
        low / high: the range of scores (an invalid thought scores ``low``).
        live: a state scoring at least this is worth growing; DFS prunes below it by default.
        solution: a finished path scoring at least this is checked correct, so a search may stop
            there; None when the verifier does not check correctness (then only a self-consistency
            vote stops a search early).
        meaning: one line on the score levels, for docs and logs.
    """

    low: float = 0.0
    high: float = 1.0
    live: float = 0.5
    solution: float | None = None
    meaning: str = ""

    def __post_init__(self) -> None:
        if not self.low <= self.live <= self.high:
            raise ValueError(f"Scale: live={self.live} must lie in [{self.low}, {self.high}]")
        if self.solution is not None and not self.low < self.solution <= self.high:
            raise ValueError(f"Scale: solution={self.solution} must lie in ({self.low}, {self.high}] or be None")

    @property
    def verifies(self) -> bool:
        """Whether some score certifies a correct answer."""
        return self.solution is not None


class Verifier(ABC):
    """Scores the state a thought leads to; higher is more promising, on the declared :attr:`scale`.

    ``name`` is the verifier's option in ``conf/verifier``; a task lists the names that fit it.
    ``max_calls_per_score`` is the most model calls one :meth:`score` makes (0: symbolic); call
    limits (``Controller(max_model_calls=...)``) plan with it. A verifier that calls the model
    reports each state it asks about with :func:`charge_model_call`.
    """

    name: str = "verifier"
    #: how tables must qualify rows this verifier scored ("" for none; the oracle: "oracle (upper bound)")
    label: str = ""
    scale: Scale = Scale()
    max_calls_per_score: int = 0

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

    def check_task(self, task: Task) -> None:
        """Refuse (ValueError naming what is valid) a task this verifier's settings cannot score; called
        when a run is built, before the model loads. By default every task its name fits."""
        del task

    def bind(self, runtime: Runtime, task: Task) -> None:
        """Called by a controller before it searches: the runtime it grows trees in and the task.

        Verifiers that need neither (symbolic checks) ignore it.
        """
        del runtime, task


# ---- model calls, charged to the search that asked ------------------------------------------
#: the states the search running in this thread (or context) has asked the model about
_CHARGED: ContextVar[set[Hashable] | None] = ContextVar("arbor_verifier_calls", default=None)


def charge_model_call(key: Hashable) -> None:
    """Charge one model call about state ``key`` to the search scoring in this thread.

    A state counts once per search, whether or not the verifier's cache answered it: what a search
    is charged does not depend on other searches that share the verifier (``concurrency=N``).
    """
    charged = _CHARGED.get()
    if charged is not None:
        charged.add(key)


@contextmanager
def charging(keys: set[Hashable]) -> Iterator[set[Hashable]]:
    """Collect into ``keys`` the states :func:`charge_model_call` reports while inside (per thread)."""
    token = _CHARGED.set(keys)
    try:
        yield keys
    finally:
        _CHARGED.reset(token)
