"""A small data folder the tests write themselves, in the layout and file formats of the real one.

Every task file of README "Data" with a few rows written for the tests (not rows of the real data
sets), so the suite needs no download and no ``../shared``. Game of 24 is the exception in size:
its file lists every solvable multiset of four numbers from 1 to 13 (1362 rows, in lexicographic
order rather than by human solve time), because tests address rows near the paper's 900-1000 slice.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

from arbor_runtime.tasks.arith24 import solvable

GAME24_HEADER = ("Rank", "Puzzles", "AMT (s)", "Solved rate", "1-sigma Mean (s)", "1-sigma STD (s)")

#: gsm8k/{test,train}.jsonl rows: worked answers ending in "#### N" (thousands separators, a negative)
GSM8K_TEST = (
    {"question": "A farmer has 12 hens and buys 5 more. Each hen lays 2 eggs. How many eggs a day?",
     "answer": "He has 12 + 5 = <<12+5=17>>17 hens.\nThey lay 17 * 2 = <<17*2=34>>34 eggs.\n#### 34"},
    {"question": "A school buys 1,250 pencils at $2 each. How much does it spend?",
     "answer": "1,250 * 2 = <<1250*2=2500>>2,500 dollars.\n#### 2,500"},
    {"question": "The temperature is 4 degrees and drops by 14 degrees. What is it now?",
     "answer": "4 - 14 = <<4-14=-10>>-10 degrees.\n#### -10"},
    {"question": "Mia reads 3 books a week for 4 weeks. How many books does she read?",
     "answer": "3 * 4 = <<3*4=12>>12 books.\n#### 12"},
)  # fmt: skip
GSM8K_TRAIN = (
    {"question": "Tom has 7 apples and eats 2. How many are left?", "answer": "7 - 2 = <<7-2=5>>5\n#### 5"},
    {"question": "A box holds 6 eggs. How many eggs are in 3 boxes?", "answer": "6 * 3 = <<6*3=18>>18\n#### 18"},
    {"question": "Sue saves $15 a week. How much after 10 weeks?", "answer": "15 * 10 = <<15*10=150>>150\n#### 150"},
)
#: math500/test.jsonl rows: a boxed solution, the answer in its own form, subject / level / id
MATH500 = (
    {"problem": "Compute $\\frac{1}{2} + \\frac{1}{3}$.", "solution": "The sum is $\\boxed{\\frac{5}{6}}$.",
     "answer": "\\frac{5}{6}", "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    {"problem": "Find the distance from $(0,0)$ to $(3,6)$.", "solution": "It is $\\boxed{3\\sqrt{5}}$.",
     "answer": "3\\sqrt{5}", "subject": "Algebra", "level": 2, "unique_id": "test/algebra/2.json"},
    {"problem": "Write the point $(0,2)$ in polar coordinates.",
     "solution": "So it is $\\boxed{\\left( 2, \\frac{\\pi}{2} \\right)}$.",
     "answer": "\\left( 2, \\frac{\\pi}{2} \\right)",
     "subject": "Precalculus", "level": 2, "unique_id": "test/precalculus/3.json"},
    {"problem": "Solve $2x = 7$.", "solution": "$x = \\boxed{3.5}$.", "answer": "\\frac{7}{2}",
     "subject": "Algebra", "level": 1, "unique_id": "test/algebra/4.json"},
)  # fmt: skip
#: aime/aime_2024_2025.jsonl rows: integer answers as the file writes them (leading zeros kept)
AIME = (
    {"id": "aime_2024_I_1", "contest": "aime_2024_I", "problem": "Find the remainder when $2^{10}$ is divided by 1000.",
     "answer": "24"},
    {"id": "aime_2024_I_2", "contest": "aime_2024_I", "problem": "How many divisors does $2^4 \\cdot 3$ have?",
     "answer": "010"},
    {"id": "aime_2025_II_1", "contest": "aime_2025_II", "problem": "Find $(7 \\cdot 11 \\cdot 13 - 1) / 10$.",
     "answer": "100"},
)  # fmt: skip
#: row counts per task file
SIZES = {"game24": 1362, "gsm8k": len(GSM8K_TEST), "gsm8k/train": len(GSM8K_TRAIN), "math500": len(MATH500),
         "aime": len(AIME)}  # fmt: skip


def game24_puzzles() -> list[tuple[int, ...]]:
    """Every solvable multiset of four numbers 1..13, in lexicographic order."""
    return [c for c in itertools.combinations_with_replacement(range(1, 14), 4) if solvable(c)]


def write_data_dir(root: Path) -> Path:
    """Write the synthetic data folder under ``root``; returns ``root``."""
    (root / "game24").mkdir(parents=True, exist_ok=True)
    with (root / "game24" / "24.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(GAME24_HEADER)
        for rank, puzzle in enumerate(game24_puzzles(), start=1):
            writer.writerow([rank, " ".join(map(str, puzzle)), 10.0, "90.00%", 10.0, 1.0])
    _jsonl(root / "gsm8k" / "test.jsonl", GSM8K_TEST)
    _jsonl(root / "gsm8k" / "train.jsonl", GSM8K_TRAIN)
    _jsonl(root / "math500" / "test.jsonl", MATH500)
    _jsonl(root / "aime" / "aime_2024_2025.jsonl", AIME)
    return root


def _jsonl(path: Path, rows: tuple[dict, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
