"""AIME 2024-2025 (I and II, 60 problems; integer answers 0-999), solved one reasoning step at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.base import Problem
from tasks.stepwise import StepwiseTask, WorkedExample, find_task_file, read_jsonl
from verifiers.answers import aime_match, extract_aime

INSTRUCTION = (
    "Solve the competition problem step by step, one step per line. The answer is an integer "
    'from 0 to 999. End with a line "The answer is N."'
)

#: written for this project (not AIME problems), one step per line
EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample(
        question="Find the number of positive divisors of $720$.",
        steps=(
            "We factor $720 = 2^4 \\cdot 3^2 \\cdot 5$.",
            "A divisor picks an exponent for each prime, so there are $(4+1)(2+1)(1+1)$ divisors.",
            "This is $5 \\cdot 3 \\cdot 2 = 30$.",
            "The answer is 30.",
        ),
        answer="30",
    ),
    WorkedExample(
        question="Find the remainder when $3^{100}$ is divided by $7$.",
        steps=(
            "Since $3^6 = 729 = 104 \\cdot 7 + 1$, we have $3^6 \\equiv 1 \\pmod{7}$.",
            "As $100 = 6 \\cdot 16 + 4$, it follows that $3^{100} \\equiv 3^4 \\pmod{7}$.",
            "Finally $3^4 = 81 = 11 \\cdot 7 + 4$.",
            "The answer is 4.",
        ),
        answer="4",
    ),
)


class AimeTask(StepwiseTask):
    """AIME over a row slice of ``aime/aime_2024_2025.jsonl``; answers compared as integers."""

    name = "aime"
    instruction = INSTRUCTION
    examples = EXAMPLES

    def __init__(
        self,
        data_dir: str | None = None,
        start: int = 0,
        end: int | None = None,
        step: str = "line",
        max_steps: int = 12,
        max_thought_tokens: int = 64,
    ) -> None:
        data_file = find_task_file(data_dir, "aime", "aime_2024_2025.jsonl")
        super().__init__(data_file, start, end, step, max_steps, max_thought_tokens)

    def extract_answer(self, text: str) -> str | None:
        """An integer 0..999 from a box, "The answer is N", or the last number; else None."""
        return extract_aime(text)

    def answers_match(self, pred: str, gold: str) -> bool:
        """Integer equality (leading zeros allowed)."""
        return aime_match(pred, gold)

    def _read_rows(self, path: Path) -> list[dict[str, Any]]:
        return read_jsonl(path, ("problem", "answer"))

    def _problem(self, index: int, row: dict[str, Any]) -> Problem:
        meta = {key: row[key] for key in ("id", "contest") if key in row}
        return Problem(index, row["problem"], str(row["answer"]), meta)
