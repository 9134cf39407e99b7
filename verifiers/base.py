"""Verifier interface: scores a node for the search controller."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from tasks.base import Problem, StepResult


class Verifier(ABC):
    """Scores the state a thought leads to; higher is more promising. Scores are in [0, 1]."""

    name: str = "verifier"

    @abstractmethod
    def score(self, problem: Problem, result: StepResult) -> float:
        """Value of the node whose thought produced ``result`` (its ``state`` is after the thought)."""

    def describe(self, problem: Problem, result: StepResult) -> dict[str, Any]:
        """Extra fields to log for a scored node (default: none)."""
        return {}
