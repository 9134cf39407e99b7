"""Task interface: what controllers and verifiers need to know about a problem family.

A task turns a problem into a root prompt, interprets each generated *thought* (one block of
text the model produced) as a :class:`StepResult`, keeps a task-specific state along the path,
and checks final answers. It declares the verifiers that can score it (``verifiers``, names of
``conf/verifier`` options, the first being its default) and its value prompt for LLM value
verifiers (``value_prompt``). This module is the task-neutral interface verifiers depend on;
tasks are plain Python: no tensors, no runtime objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


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
        answer: the final answer a terminal thought states (None when it states none, or the path
            goes on); what ``Task.is_correct`` checks and what self-consistency votes on.
    """

    state: Any
    forced_text: str = ""
    valid: bool = True
    terminal: bool = False
    reason: str = ""
    answer: str | None = None


@dataclass(frozen=True, slots=True)
class Proposal:
    """How the next thoughts after a state are proposed.

    Attributes:
        choices: fixed candidate thoughts the model ranks (``Runtime.choose``; the best are kept);
            empty: the thoughts are sampled.
        regex / grammar: when sampling, the regular expression or Lark grammar every thought must
            match (None: free; at most one of them).
    """

    choices: tuple[str, ...] = ()
    regex: str | None = None
    grammar: str | None = None


class ValueQuery(NamedTuple):
    """One state's part of a value prompt: ``key`` identifies the state (equal keys are evaluated
    once), ``text`` is appended under the prompt's prefix and the model completes the verdict."""

    key: Hashable
    text: str


class ValuePrompt(ABC):
    """A task's value prompt in the Tree-of-Thoughts style: a few-shot prefix whose examples end in
    a verdict (sure / likely / impossible), then one query per state.

    Attributes:
        prefix: the few-shot part, shared by every state (an LLM value verifier prefills it once).
    """

    prefix: str = ""
    #: trial lines the model writes before its verdict (ToT's value prompt tries the numbers first;
    #: 0: verdict first). A prompt with trials ends each query before the verdict's cue, the verifier
    #: has the model write its trials (:meth:`trials` keeps them) and then scores the verdicts after
    #: :attr:`verdict_cue`.
    lookahead: int = 0
    #: what the verdict follows in a query with trials ("Judgement:")
    verdict_cue: str = ""

    @abstractmethod
    def query(self, problem: Problem, state: Any) -> ValueQuery:
        """The query of the state after a thought."""

    def with_lookahead(self, depth: int) -> ValuePrompt:
        """This prompt with ``depth`` trial lines before each verdict (its examples show that many); a
        prompt without a trial form takes only 0 (ValueError naming what is valid)."""
        if depth == 0:
            return self
        raise ValueError(f"verifier.lookahead={depth}: this task's value prompt has no trial lines; valid: 0")

    def trials(self, written: str, query: ValueQuery, exact: bool = False) -> str:
        """The trial lines to keep of what the model wrote after ``query`` (at most :attr:`lookahead`);
        ``exact``: only trials the task can check, each with its value computed by the task, not the model."""
        del written, query, exact
        return ""

    def examples_span(self) -> tuple[int, int] | None:
        """The character span [start, end) of ``prefix`` that holds its examples (token-extracted
        first below a tree-aware policy's floor; the header stays); None: not marked."""
        return None

    def finished_score(self, problem: Problem, result: StepResult) -> float | None:
        """The score of a finished path when the task knows it without the model, else None.

        By default a finished path that states no answer scores 0.0 and one with an answer is
        left to the model.
        """
        return 0.0 if result.answer is None else None


class Task(ABC):
    """A family of problems solved by growing thoughts step by step."""

    name: str = "task"
    #: stop strings that end one thought (one generation call)
    stop: tuple[str, ...] = ("\n",)
    #: tokens one thought may take at most
    max_thought_tokens: int = 48
    #: thoughts along one root-to-leaf path at most
    max_steps: int = 4
    #: names of the verifiers (``conf/verifier/<name>.yaml``) that can score this task; the first
    #: is its default, which the task's config selects
    verifiers: tuple[str, ...] = ()
    #: the value prompt an LLM value verifier uses, or None when the task has none
    value_prompt: ValuePrompt | None = None

    @abstractmethod
    def problems(self) -> list[Problem]:
        """The problems of the configured slice, in file order."""

    @abstractmethod
    def prompt(self, problem: Problem) -> str:
        """Root block text: few-shot prefix plus the problem."""

    def examples_span(self, problem: Problem) -> tuple[int, int] | None:
        """The character span [start, end) of ``prompt(problem)`` that holds few-shot examples.

        Below a tree-aware policy's floor (``policy=arbor`` with a budget smaller than the prompt
        plus the deepest path) those tokens are token-extracted by value first, while the rest of
        the prompt (instruction, question) stays on the device. None (the default): not marked.
        """
        return None

    @abstractmethod
    def initial_state(self, problem: Problem) -> Any:
        """State at the root, before any thought."""

    @abstractmethod
    def step(self, problem: Problem, state: Any, thought: str) -> StepResult:
        """Interpret one generated thought given the state of its parent (a terminal result
        carries the answer it states)."""

    @abstractmethod
    def is_correct(self, problem: Problem, answer: str | None) -> bool:
        """Whether a stated final answer solves the problem (None never does)."""

    def propose(self, problem: Problem, state: Any) -> Proposal:
        """How to propose the thoughts after ``state`` (default: sample them freely)."""
        return Proposal()

    def answers_match(self, pred: str, gold: str) -> bool:
        """Whether two stated answers are the same answer (self-consistency votes on this)."""
        return pred == gold

    def state_key(self, state: Any) -> Hashable | None:
        """The identity of a state: candidates whose states have equal keys are duplicates, and a
        search keeps only the first. None (the default) never matches: no deduplication."""
        return None
