"""Task interface: what a controller needs to know about a problem family.

A task turns a problem into a root prompt, interprets each generated *thought* (one block of
text the model produced), keeps a task-specific state along the path, and checks final answers.
Tasks are plain Python: no tensors, no runtime objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem of a task.

    Attributes:
        index: 0-based row index in the task's data file.
        question: the problem text as shown to the model (Game of 24: "4 4 6 8").
        answer: the reference answer when the data file has one, else None.
        meta: anything else the data row carries (rank, subject, level, ...).
    """

    index: int
    question: str
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a task makes of one generated thought.

    Attributes:
        state: the task state after this thought (opaque to controllers; JSON-friendly repr).
        forced_text: text the task appends after the thought as a teacher-forced block ("" for none),
            e.g. the exact "(left: ...)" part in Game of 24.
        valid: False when the thought is malformed or breaks the task's rules.
        terminal: True when the path is finished (an answer was given, or nothing is left to do).
        reason: a short human-readable note on why a thought is invalid ("" when valid).
    """

    state: Any
    forced_text: str = ""
    valid: bool = True
    terminal: bool = False
    reason: str = ""


class Task(ABC):
    """A family of problems solved by growing thoughts step by step."""

    name: str = "task"
    #: stop strings that end one thought (one generation call)
    stop: tuple[str, ...] = ("\n",)
    #: tokens one thought may take at most
    max_thought_tokens: int = 48
    #: thoughts along one root-to-leaf path at most
    max_steps: int = 4

    @abstractmethod
    def problems(self) -> list[Problem]:
        """The problems of the configured slice, in file order."""

    @abstractmethod
    def prompt(self, problem: Problem) -> str:
        """Root block text: few-shot prefix plus the problem."""

    @abstractmethod
    def initial_state(self, problem: Problem) -> Any:
        """State at the root, before any thought."""

    @abstractmethod
    def step(self, problem: Problem, state: Any, thought: str) -> StepResult:
        """Interpret one generated thought given the state of its parent."""

    @abstractmethod
    def final_answer(self, problem: Problem, state: Any) -> str | None:
        """The answer a terminal state gives, or None when it gives none."""

    @abstractmethod
    def is_correct(self, problem: Problem, state: Any) -> bool:
        """Whether a (terminal) state solves the problem."""


def resolve_data_file(data_dir: str | Path | None, relative: str, fallback: Path | None = None) -> Path:
    """Locate a task data file.

    Looks in ``data_dir/relative`` when ``data_dir`` is given, else at ``fallback``. Raises
    ``FileNotFoundError`` naming every place looked at, so the user knows what to fix.
    """
    tried: list[Path] = []
    if data_dir is not None:
        path = Path(data_dir).expanduser() / relative
        if path.is_file():
            return path
        tried.append(path)
    if fallback is not None:
        if fallback.is_file():
            return fallback
        tried.append(fallback)
    looked = ", ".join(str(p) for p in tried) or "(no location configured)"
    raise FileNotFoundError(
        f"data file {relative!r} not found; looked at: {looked}. "
        "Set task.data_dir to a folder holding it (see README: Data)."
    )


def check_slice(start: int, end: int | None, size: int, name: str) -> tuple[int, int]:
    """Validate a ``[start, end)`` slice over ``size`` rows; ``end=None`` means to the end."""
    stop = size if end is None else end
    if start < 0 or stop < 0:
        raise ValueError(f"{name}: task.start={start} / task.end={end} must be >= 0")
    if start > stop:
        raise ValueError(f"{name}: task.start={start} is greater than task.end={stop}")
    if stop > size:
        raise ValueError(f"{name}: task.end={stop} is past the last row; the file has {size} rows (0..{size - 1})")
    return start, stop
