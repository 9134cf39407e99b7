"""GSM8K grade-school word problems (openai/grade-school-math), solved one reasoning step at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.base import Problem
from tasks.stepwise import StepwiseTask, WorkedExample, find_task_file, read_jsonl
from verifiers.answers import extract_gsm8k_gold, extract_number, gsm8k_match

SPLITS = ("test", "train")

INSTRUCTION = (
    "Solve the math word problem step by step, one step per line. "
    'End with a line "The answer is N." where N is a number.'
)

#: written for this project (not GSM8K rows), one step per line
EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample(
        question=(
            "A baker makes 24 muffins. She sells 15 of them and gives 3 to a neighbor. "
            "How many muffins does she have left?"
        ),
        steps=(
            "After selling 15 muffins she has 24 - 15 = 9 muffins.",
            "After giving 3 to the neighbor she has 9 - 3 = 6 muffins.",
            "The answer is 6.",
        ),
        answer="6",
    ),
    WorkedExample(
        question=(
            "Tom buys 3 notebooks for $4 each and a pen for $2. He pays with a $50 bill. How much change does he get?"
        ),
        steps=(
            "The notebooks cost 3 * 4 = $12.",
            "Together with the pen he spends 12 + 2 = $14.",
            "His change is 50 - 14 = $36.",
            "The answer is 36.",
        ),
        answer="36",
    ),
)


class GSM8KTask(StepwiseTask):
    """GSM8K over a row slice of ``gsm8k/<split>.jsonl``; the reference is the number after "####"."""

    name = "gsm8k"
    instruction = INSTRUCTION
    examples = EXAMPLES

    def __init__(
        self,
        data_dir: str | None = None,
        start: int = 0,
        end: int | None = None,
        split: str = "test",
        step: str = "line",
        max_steps: int = 8,
        max_thought_tokens: int = 64,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"gsm8k: task.split={split!r} is not one of {list(SPLITS)}")
        self.split = split
        data_file = find_task_file(data_dir, "gsm8k", f"{split}.jsonl")
        super().__init__(data_file, start, end, step, max_steps, max_thought_tokens)

    def extract_answer(self, text: str) -> str | None:
        """The number after "The answer is" / "####", else the last number."""
        return extract_number(text)

    def answers_match(self, pred: str, gold: str) -> bool:
        """Numeric equality within 1e-6."""
        return gsm8k_match(pred, gold)

    def _read_rows(self, path: Path) -> list[dict[str, Any]]:
        return read_jsonl(path, ("question", "answer"))

    def _problem(self, index: int, row: dict[str, Any]) -> Problem:
        return Problem(index, row["question"], extract_gsm8k_gold(row["answer"]), {"split": self.split})
