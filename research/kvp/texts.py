"""Training texts for KVP: few-shot contexts from training data, each followed by one more example.

A text is (context, future): an instruction and worked examples (the context whose tokens are
scored), then one more worked example (the future whose queries' attention is the target). This
mirrors the held-out protocol of ``bench_linear.py`` (compress a few-shot context, then answer).

Sources, never the evaluation slices: GSM8K *train* rows from ``GSM8K_FIRST_ROW`` on (rows before
it are the few-shot examples of the benchmark contexts), and Game of 24 rows outside 900-999
(the test slice), with solutions found by search.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from arbor_runtime.tasks.arith24 import apply_op, format_number, solvable
from arbor_runtime.tasks.game24 import INSTRUCTION as GAME24_INSTRUCTION
from arbor_runtime.tasks.stepwise import format_example
from benchmarks.linear import GSM8K_INSTRUCTION, gsm8k_steps

GSM8K_FIRST_ROW = 100  # rows 0..99 of gsm8k/train are kept out: bench_linear's few-shot examples
GAME24_TEST = range(900, 1000)


@dataclass(frozen=True, slots=True)
class TrainingText:
    """One collected sequence: its source, the rows it used, the context and the future text."""

    source: str
    rows: tuple[int, ...]
    context: str
    future: str


def gsm8k_examples(data_dir: Path) -> list[tuple[int, str]]:
    """(row, worked example) for every usable GSM8K train row."""
    path = data_dir / "gsm8k" / "train.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (--data-dir points at the shared data folder)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(i, format_example(r["question"], gsm8k_steps(r["answer"]))) for i, r in enumerate(rows)][GSM8K_FIRST_ROW:]


def game24_examples(data_dir: Path) -> list[tuple[int, str]]:
    """(row, solved puzzle in the task's own step format) for every Game of 24 row outside 900-999."""
    path = data_dir / "game24" / "24.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (--data-dir points at the shared data folder)")
    lines = path.read_text().splitlines()[1:]
    out = []
    for i, line in enumerate(lines):
        if i in GAME24_TEST:
            continue
        numbers = [int(x) for x in line.split(",")[1].split()]
        steps = solve24([Fraction(n) for n in numbers])
        if steps is not None:
            out.append((i, f"Input: {' '.join(map(str, numbers))}\nSteps:\n" + "".join(s + "\n" for s in steps)))
    return out


def solve24(values: list[Fraction]) -> list[str] | None:
    """Step lines "a op b = c (left: ...)" reaching 24, searched depth first; None when unsolvable."""
    if len(values) == 1:
        return [] if values[0] == 24 else None
    for i in range(len(values)):
        for j in range(len(values)):
            if i == j:
                continue
            rest = [v for k, v in enumerate(values) if k not in (i, j)]
            for op in "+-*/":
                if op == "/" and values[j] == 0:
                    continue
                z = apply_op(values[i], op, values[j])
                if not solvable([*rest, z]):
                    continue
                left = " ".join(format_number(v) for v in sorted([*rest, z]))
                step = f"{format_number(values[i])} {op} {format_number(values[j])} = {format_number(z)} (left: {left})"
                tail = solve24([*rest, z])
                if tail is not None:
                    return [step, *tail]
    return None


def training_texts(
    data_dir: Path, count: int, seed: int, min_context: int, max_context: int, count_tokens, game24_share: float = 0.25
) -> Iterator[TrainingText]:
    """``count`` texts; each context has between ``min_context`` and ``max_context`` tokens (by
    ``count_tokens(text)``), its examples drawn at random from one source."""
    rng = random.Random(seed)
    pools = {"gsm8k": gsm8k_examples(data_dir), "game24": game24_examples(data_dir) if game24_share > 0 else []}
    instructions = {"gsm8k": GSM8K_INSTRUCTION, "game24": GAME24_INSTRUCTION}
    if not pools["gsm8k"] and game24_share < 1.0:
        raise ValueError(f"{data_dir}/gsm8k/train.jsonl has no rows from {GSM8K_FIRST_ROW} on to train with")
    for _ in range(count):
        source = "game24" if rng.random() < game24_share and pools["game24"] else "gsm8k"
        target = rng.randint(min_context, max_context)
        parts, rows = [instructions[source] + "\n"], []
        while count_tokens("\n".join(parts)) < target:
            row, text = rng.choice(pools[source])
            parts.append(text)
            rows.append(row)
        row, future = rng.choice(pools[source])
        yield TrainingText(source, (*rows, row), "\n".join(parts), "\n" + future)
