"""Shared base of the math tasks (GSM8K, MATH-500, AIME): free-form reasoning, one step per thought.

A thought is one line (``step="line"``) or one sentence (``step="sentence"``) of a worked solution.
The task keeps the steps so far; a step that states the final answer ("The answer is ...", "####",
"\\boxed") ends the path, and so does reaching ``max_steps``. The prompt is an instruction, worked
examples and the question, all rendered by ``format_example`` so examples and query share one format.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tasks.base import Problem, StepResult, Task, check_slice, resolve_data_file

#: stop strings of one thought, per step granularity
STEP_STOPS: dict[str, tuple[str, ...]] = {"line": ("\n",), "sentence": (". ", ".\n", "\n")}
#: a step matching this states the final answer and ends the path
FINAL_ANSWER_MARKER = re.compile(r"the answer is|####|\\boxed|\\fbox", re.IGNORECASE)


class WorkedExample(NamedTuple):
    """One few-shot example: the question, its solution steps (the last gives the answer), the answer."""

    question: str
    steps: tuple[str, ...]
    answer: str


@dataclass(frozen=True, slots=True)
class StepwiseState:
    """Steps taken on one path (stripped thoughts) and the final answer once one was stated."""

    steps: tuple[str, ...] = ()
    answer: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain dict for logs."""
        return {"steps": list(self.steps), "answer": self.answer}


def format_example(question: str, steps: tuple[str, ...] = ()) -> str:
    """A question block: "Question: ...\\nSolution:\\n" then one line per step."""
    return f"Question: {question.strip()}\nSolution:\n" + "".join(f"{s}\n" for s in steps)


def find_task_file(data_dir: str | Path | None, folder: str, filename: str) -> Path:
    """``data_dir/folder/filename`` or ``data_dir/filename`` (``data_dir`` is the shared data root or
    the task's own folder). No packaged fallback: None or a folder without the file raises
    ``FileNotFoundError`` naming the paths and ``task.data_dir``."""
    if data_dir is None:
        return resolve_data_file(None, f"{folder}/{filename}")
    root = Path(data_dir).expanduser()
    return resolve_data_file(root, f"{folder}/{filename}", fallback=root / filename)


def read_jsonl(path: Path, required: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; ValueError naming the file and line for bad JSON or missing keys."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            missing = [key for key in required if key not in row]
            if missing:
                raise ValueError(f"{path}:{number}: missing field(s) {missing}; expected {list(required)}")
            rows.append(row)
    return rows


class StepwiseTask(Task):
    """Base of the math tasks; subclasses give the data, examples and answer rules."""

    name = "stepwise"
    max_thought_tokens = 64
    #: first line of the prompt
    instruction: str = ""
    #: few-shot examples shown before the question
    examples: tuple[WorkedExample, ...] = ()

    def __init__(
        self, data_file: Path, start: int, end: int | None, step: str, max_steps: int, max_thought_tokens: int
    ) -> None:
        if step not in STEP_STOPS:
            raise ValueError(f"{self.name}: task.step={step!r} is not one of {sorted(STEP_STOPS)}")
        if max_steps < 1:
            raise ValueError(f"{self.name}: task.max_steps={max_steps} must be >= 1")
        if max_thought_tokens < 1:
            raise ValueError(f"{self.name}: task.max_thought_tokens={max_thought_tokens} must be >= 1")
        self.step_kind, self.stop = step, STEP_STOPS[step]
        self.max_steps, self.max_thought_tokens = max_steps, max_thought_tokens
        self.data_file = data_file
        rows = self._read_rows(data_file)
        self.start, self.end = check_slice(start, end, len(rows), self.name)
        self._problems = [self._problem(i, rows[i]) for i in range(self.start, self.end)]

    def problems(self) -> list[Problem]:
        """The problems of the configured slice, in file order."""
        return list(self._problems)

    def prompt(self, problem: Problem) -> str:
        """Instruction, worked examples, then "Question: ...\\nSolution:\\n"; blocks split by a blank line."""
        shots = [format_example(e.question, e.steps) for e in self.examples]
        return "\n".join([self.instruction + "\n", *shots, format_example(problem.question)])

    def initial_state(self, problem: Problem) -> StepwiseState:
        """No steps, no answer."""
        return StepwiseState()

    def step(self, problem: Problem, state: StepwiseState, thought: str) -> StepResult:
        """Append the stripped thought; an answer marker or ``max_steps`` ends the path.

        An empty (whitespace-only) thought is invalid and keeps ``state``. Nothing is forced.
        """
        text = thought.strip()
        if not text:
            return StepResult(state=state, valid=False, reason="empty thought")
        steps = (*state.steps, text)
        if FINAL_ANSWER_MARKER.search(text):
            return StepResult(state=StepwiseState(steps, self.extract_answer(text)), terminal=True)
        return StepResult(state=StepwiseState(steps), terminal=len(steps) >= self.max_steps)

    def final_answer(self, problem: Problem, state: StepwiseState) -> str | None:
        """The answer the path stated, or None."""
        return state.answer

    def is_correct(self, problem: Problem, state: StepwiseState) -> bool:
        """Whether the stated answer matches the reference answer."""
        if state.answer is None or problem.answer is None:
            return False
        return self.answers_match(state.answer, problem.answer)

    @abstractmethod
    def extract_answer(self, text: str) -> str | None:
        """The answer a final step states, or None when it states none."""

    @abstractmethod
    def answers_match(self, pred: str, gold: str) -> bool:
        """Whether an extracted answer equals the reference answer."""

    @abstractmethod
    def _read_rows(self, path: Path) -> list[dict[str, Any]]:
        """The rows of the data file."""

    @abstractmethod
    def _problem(self, index: int, row: dict[str, Any]) -> Problem:
        """The problem of 0-based row ``index``."""
