"""MATH-500 (the prm800k test split of MATH), solved one reasoning step at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.base import Problem
from tasks.stepwise import StepwiseTask, WorkedExample, find_task_file, read_jsonl
from verifiers.answers import extract_math_answer, math_equal

INSTRUCTION = (
    "Solve the math problem step by step, one step per line. "
    'End with a line "The answer is $\\boxed{ANSWER}$." giving the answer in simplest form.'
)

#: written for this project (not MATH rows), one step per line
EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample(
        question="Compute $\\frac{3}{4} + \\frac{1}{6}$.",
        steps=(
            "The least common denominator of 4 and 6 is 12.",
            "We have $\\frac{3}{4} = \\frac{9}{12}$ and $\\frac{1}{6} = \\frac{2}{12}$.",
            "So the sum is $\\frac{9}{12} + \\frac{2}{12} = \\frac{11}{12}$.",
            "The answer is $\\boxed{\\frac{11}{12}}$.",
        ),
        answer="\\frac{11}{12}",
    ),
    WorkedExample(
        question="Find the distance between the points $(1, 2)$ and $(4, 8)$.",
        steps=(
            "The horizontal change is $4 - 1 = 3$ and the vertical change is $8 - 2 = 6$.",
            "By the distance formula the distance is $\\sqrt{3^2 + 6^2} = \\sqrt{45}$.",
            "Since $45 = 9 \\cdot 5$, this is $3\\sqrt{5}$.",
            "The answer is $\\boxed{3\\sqrt{5}}$.",
        ),
        answer="3\\sqrt{5}",
    ),
)


class Math500Task(StepwiseTask):
    """MATH-500 over a row slice of ``math500/test.jsonl``; answers compared by ``math_equal``."""

    name = "math500"
    instruction = INSTRUCTION
    examples = EXAMPLES

    def __init__(
        self,
        data_dir: str | None = None,
        start: int = 0,
        end: int | None = None,
        step: str = "line",
        max_steps: int = 10,
        max_thought_tokens: int = 64,
    ) -> None:
        data_file = find_task_file(data_dir, "math500", "test.jsonl")
        super().__init__(data_file, start, end, step, max_steps, max_thought_tokens)

    def extract_answer(self, text: str) -> str | None:
        """The last box, else what follows "The answer is"."""
        return extract_math_answer(text)

    def answers_match(self, pred: str, gold: str) -> bool:
        """Equivalence after normalization, numerically or symbolically."""
        return math_equal(pred, gold)

    def _read_rows(self, path: Path) -> list[dict[str, Any]]:
        return read_jsonl(path, ("problem", "answer"))

    def _problem(self, index: int, row: dict[str, Any]) -> Problem:
        meta = {key: row[key] for key in ("subject", "level", "unique_id") if key in row}
        return Problem(index, row["problem"], row["answer"], meta)
