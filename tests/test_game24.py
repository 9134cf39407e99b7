"""Game of 24: data loading, thought parsing, forced text, the exact oracle and expression checks.

The real puzzle file ships in ``tree-of-thoughts-llm`` (part of the setup), so the tests over all
1362 puzzles and the paper's slice run everywhere; folder layouts use the synthetic data folder.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from fractions import Fraction

import pytest
from synthetic_data import SIZES, game24_puzzles

from arbor_runtime.tasks.arith24 import check_expression, parse_puzzle, solvable
from arbor_runtime.tasks.base import Problem, StepResult
from arbor_runtime.tasks.game24 import FEW_SHOT_EXAMPLES, Game24State, Game24Task, find_data_file
from arbor_runtime.verifiers.game24_oracle import DEAD_END_SCORE, Game24OracleVerifier

HAS_TOT = importlib.util.find_spec("tot") is not None


@pytest.fixture(scope="module")
def task() -> Game24Task:
    """The default task: the ToT paper's slice of the packaged puzzle file."""
    assert HAS_TOT, "tree-of-thoughts-llm is part of the setup (make setup installs it with --no-deps)"
    return Game24Task()


def problem(question: str = "4 4 6 8") -> Problem:
    return Problem(index=0, question=question)


def play(task: Game24Task, question: str, thoughts: list[str]) -> tuple[StepResult, str]:
    """Apply ``thoughts`` in order; the last result and the full text (thoughts + forced text)."""
    prob = problem(question)
    state, text, result = task.initial_state(prob), "", None
    for thought in thoughts:
        result = task.step(prob, state, thought)
        assert result.valid, result.reason
        state, text = result.state, text + thought + result.forced_text
    return result, text


# --- oracle -------------------------------------------------------------------------------------


def test_every_csv_puzzle_is_solvable():
    with find_data_file(None).open(newline="") as f:
        puzzles = [row["Puzzles"] for row in csv.DictReader(f)]
    assert len(puzzles) == 1362
    unsolved = [p for p in puzzles if not solvable(parse_puzzle(p))]
    assert unsolved == []
    # the file holds exactly the solvable multisets of 1..13 (what the synthetic file lists)
    assert sorted(tuple(sorted(parse_puzzle(p))) for p in puzzles) == game24_puzzles()


@pytest.mark.parametrize("numbers", [(1, 1, 1, 1), (1, 1, 1, 2), (13, 13, 13, 13), (1, 1, 2, 2)])
def test_known_unsolvable_sets(numbers):
    assert not solvable(numbers)


def test_solvable_needs_fractions_and_handles_small_sets():
    assert solvable((3, 3, 8, 8))  # 8 / (3 - 8/3)
    assert solvable((1, 5, 5, 5))  # 5 * (5 - 1/5)
    assert solvable([Fraction(24)])
    assert solvable([Fraction(8, 3), 9])
    assert not solvable([23])
    assert not solvable([])


# --- check_expression ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "inputs"),
    [
        ("(6 - 4) * (4 + 8)", (4, 4, 6, 8)),
        ("8 / (3 - 8 / 3)", (3, 3, 8, 8)),
        ("5 × (5 - 1 ÷ 5)", (1, 5, 5, 5)),
        ("((6 - 4) * (4 + 8))", (8, 6, 4, 4)),
    ],
)
def test_check_expression_accepts(expr, inputs):
    assert check_expression(expr, inputs)


@pytest.mark.parametrize(
    ("expr", "inputs"),
    [
        ("(6 - 4) * (4 + 8)", (4, 4, 6, 9)),  # wrong multiset
        ("6 * 4", (4, 4, 6, 8)),  # numbers left out
        ("(6 - 4) * (4 + 8) + 8 - 8", (4, 4, 6, 8)),  # a number used twice
        ("(6 + 4) * (4 + 8)", (4, 4, 6, 8)),  # wrong value
        ("4 / (4 - 4) + 6 + 8", (4, 4, 4, 6, 8)),  # division by zero
        ("-(4 - 6) * (4 + 8)", (4, 4, 6, 8)),  # unary minus is not a game operation
        ("6 ** 2 - 4 - 8", (2, 4, 6, 8)),  # power
        ("24.0", (24,)),  # floats
        ("True * 24", (1, 24)),  # bools are not numbers
        ("__import__('os')", (4, 4, 6, 8)),
        ("(6 - 4) * (4 + 8", (4, 4, 6, 8)),  # syntax error
        ("(" * 300 + "24" + ")" * 300, (24,)),  # too long
    ],
)
def test_check_expression_rejects(expr, inputs):
    assert not check_expression(expr, inputs)


# --- puzzles and data ---------------------------------------------------------------------------


def test_parse_puzzle():
    assert parse_puzzle(" 4 4  6 8\n") == (4, 4, 6, 8)


@pytest.mark.parametrize("text", ["4 4 6", "4 4 6 8 9", "4 4 six 8", "4 4 6 8.5", "4,4,6,8", ""])
def test_parse_puzzle_rejects_malformed(text):
    with pytest.raises(ValueError, match="malformed Game of 24 puzzle"):
        parse_puzzle(text)


def test_default_slice_is_tot_ranks_901_to_1000(task):
    problems = task.problems()
    assert len(problems) == 100
    assert (problems[0].index, problems[0].meta["rank"]) == (900, 901)
    assert (problems[-1].index, problems[-1].meta["rank"]) == (999, 1000)
    assert problems[0].question == "4 5 6 10"
    assert problems[0].answer is None


@pytest.mark.parametrize("sub", ["", "game24"])
def test_data_dir_at_data_root_or_game24_folder(sub, data_dir):
    task = Game24Task(data_dir=str(data_dir / sub), start=0, end=3)
    assert [p.question for p in task.problems()] == ["1 1 1 8", "1 1 1 11", "1 1 1 12"]
    assert [p.meta["rank"] for p in task.problems()] == [1, 2, 3]


def test_end_none_reads_to_the_last_row(data_dir):
    assert len(Game24Task(data_dir=str(data_dir), start=SIZES["game24"] - 2, end=None).problems()) == 2


def test_slice_errors(data_dir):
    with pytest.raises(ValueError, match="greater than"):
        Game24Task(data_dir=str(data_dir), start=10, end=5)
    with pytest.raises(ValueError, match="past the last row.*1362 rows"):
        Game24Task(data_dir=str(data_dir), start=0, end=1363)
    with pytest.raises(ValueError, match="n_shots"):
        Game24Task(data_dir=str(data_dir), n_shots=99)


def test_missing_data_dir_names_the_paths(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        Game24Task(data_dir=str(missing))
    assert str(missing / "game24" / "24.csv") in str(err.value)
    assert str(missing / "24.csv") in str(err.value)


def test_malformed_row_is_reported(tmp_path):
    (tmp_path / "24.csv").write_text("Rank,Puzzles\n1,4 4 6 8\n2,4 4 x 8\n")
    assert len(Game24Task(data_dir=str(tmp_path), start=0, end=1).problems()) == 1
    with pytest.raises(ValueError, match="'4 4 x 8'"):
        Game24Task(data_dir=str(tmp_path), start=0, end=2)


def test_fallback_to_tot_package_file():
    assert HAS_TOT, "tree-of-thoughts-llm is part of the setup (make test installs it with --no-deps)"
    path = find_data_file(None)
    assert path.parts[-4:] == ("tot", "data", "24", "24.csv")
    assert Game24Task(start=900, end=901).problems()[0].question == "4 5 6 10"
    assert "tot" not in sys.modules  # located, never imported


def test_no_fallback_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="24.csv"):
        find_data_file(None)


# --- prompt and few-shot examples ---------------------------------------------------------------


def test_prompt_layout(task):
    prob = task.problems()[0]
    text = task.prompt(prob)
    assert text.endswith("\n\nInput: 4 5 6 10\nSteps:\n")
    assert text.count("Input: ") == len(FEW_SHOT_EXAMPLES) + 1
    assert "\n" not in text.split("\n\n")[0]  # one-line instruction
    zero_shot = Game24Task(start=0, end=1, n_shots=0)
    assert zero_shot.prompt(prob).count("Input: ") == 1


@pytest.mark.parametrize("example", FEW_SHOT_EXAMPLES)
def test_few_shot_examples_replay_exactly_and_are_correct(task, example):
    lines = example.splitlines(keepends=True)
    question = lines[0].removeprefix("Input: ").strip()
    thoughts = [line[: line.index("(left") + len("(left")] for line in lines[2:5]]
    result, text = play(task, question, thoughts)
    assert "".join(lines[:2]) + text == example
    assert result.terminal
    assert task.is_correct(problem(question), result.answer)
    assert check_expression(result.answer, parse_puzzle(question))


# --- step parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("thought", "left"),
    [
        ("4 + 8 = 12 (left", ("4", "6", "12")),
        ("8 × 6 = 48\n", ("4", "4", "48")),
        ("8 x 6 = 48", ("4", "4", "48")),
        ("8 * 6 = 48", ("4", "4", "48")),
        ("6 ÷ 4 = 3/2 (left", ("3/2", "4", "8")),
        ("4 - 8 = -4 (left", ("-4", "4", "6")),
        ("4 / 4 = 1 (left", ("1", "6", "8")),
        ("  4 + 4 = 8  (left", ("6", "8", "8")),
    ],
)
def test_step_accepts(task, thought, left):
    result = task.step(problem(), task.initial_state(problem()), thought)
    assert result.valid, result.reason
    assert not result.terminal
    assert tuple(result.state.to_json()["left"]) == left


def test_step_with_fraction_operands(task):
    prob = problem("3 3 8 8")
    state = task.step(prob, task.initial_state(prob), "8 / 3 = 8/3 (left").state
    result = task.step(prob, state, "3 - 8/3 = 1/3 (left")
    assert result.valid and result.forced_text == ": 1/3 8)\n"
    result = task.step(prob, result.state, "8 / 1/3 = 24 (left")
    assert result.terminal and result.forced_text == ": 24)\nAnswer: 8 / (3 - (8 / 3)) = 24\n"
    assert result.answer == "8 / (3 - (8 / 3))" and task.is_correct(prob, result.answer)


@pytest.mark.parametrize(
    ("thought", "reason"),
    [
        ("", "malformed"),
        ("garbage\n", "malformed"),
        ("4+8=12 (left", "malformed"),  # the operator must be spaced
        ("4 + 8 (left", "malformed"),
        ("4 ^ 8 = 12", "malformed"),
        ("4.0 + 8 = 12", "malformed"),
        ("4 + 8 = 12 and 6 - 4 = 2 (left", "unexpected text"),
        ("4 + 9 = 13 (left", "not among the remaining numbers"),
        ("6 + 6 = 12 (left", "not among the remaining numbers"),  # one 6 only
        ("4 + 8 = 13 (left", "wrong arithmetic: 4 + 8 = 12, not 13"),
        ("6 / 4 = 1 (left", "wrong arithmetic"),
        ("1/0 + 4 = 4 (left", "zero denominator"),
    ],
)
def test_step_rejects(task, thought, reason):
    state = task.initial_state(problem())
    result = task.step(problem(), state, thought)
    assert not result.valid
    assert reason in result.reason
    assert result.state is state and result.forced_text == "" and not result.terminal


def test_step_division_by_zero(task):
    result, _ = play(task, "4 4 6 8", ["4 - 4 = 0 (left"])
    bad = task.step(problem(), result.state, "6 / 0 = 0 (left")
    assert not bad.valid and "division by zero" in bad.reason


def test_duplicate_numbers_use_distinct_entries(task):
    result, _ = play(task, "4 4 6 8", ["4 + 4 = 8 (left"])
    assert result.state.to_json()["left"] == ["6", "8", "8"]
    again = task.step(problem(), result.state, "8 + 8 = 16 (left")
    assert again.valid and again.state.to_json()["expressions"] == ["6", "(8 + (4 + 4))"]


# --- forced text --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("thought", "forced"),
    [
        ("6 - 4 = 2 (left", ": 2 4 8)\n"),
        ("6 - 4 = 2\n", "(left: 2 4 8)\n"),
        ("6 - 4 = 2", " (left: 2 4 8)\n"),
        ("6 - 4 = 2 ", "(left: 2 4 8)\n"),
    ],
)
def test_forced_text_for_each_ending(task, thought, forced):
    assert task.step(problem(), task.initial_state(problem()), thought).forced_text == forced


def test_terminal_forced_text_for_each_ending(task):
    result, text = play(task, "4 4 6 8", ["4 + 8 = 12 (left", "6 - 4 = 2 (left"])
    assert text == "4 + 8 = 12 (left: 4 6 12)\n6 - 4 = 2 (left: 2 12)\n"
    answer = "Answer: (6 - 4) * (4 + 8) = 24\n"
    for thought, forced in [
        ("2 * 12 = 24 (left", ": 24)\n" + answer),
        ("2 * 12 = 24\n", "(left: 24)\n" + answer),
        ("2 * 12 = 24", " (left: 24)\n" + answer),
    ]:
        last = task.step(problem(), result.state, thought)
        assert last.terminal and last.forced_text == forced


# --- full paths and the verifier ----------------------------------------------------------------


def test_full_solution_path(task):
    result, text = play(task, "4 4 6 8", ["4 + 8 = 12 (left", "6 - 4 = 2 (left", "2 * 12 = 24 (left"])
    assert text == (
        "4 + 8 = 12 (left: 4 6 12)\n6 - 4 = 2 (left: 2 12)\n2 * 12 = 24 (left: 24)\nAnswer: (6 - 4) * (4 + 8) = 24\n"
    )
    assert result.terminal
    assert result.answer == "(6 - 4) * (4 + 8)"
    assert task.is_correct(problem(), result.answer)
    assert Game24OracleVerifier().score(problem(), result) == 1.0
    assert result.state.to_json()["steps"] == ["4 + 8 = 12", "6 - 4 = 2", "2 * 12 = 24"]


def test_wrong_terminal_path(task):
    result, text = play(task, "4 4 6 8", ["4 + 4 = 8 (left", "6 + 8 = 14 (left", "8 + 14 = 22 (left"])
    assert result.terminal
    assert text.endswith("(left: 22)\nAnswer: (4 + 4) + (6 + 8) = 22\n")
    assert result.answer == "(4 + 4) + (6 + 8)"
    assert not task.is_correct(problem(), result.answer)
    assert Game24OracleVerifier().score(problem(), result) == 0.0


def test_non_terminal_step_has_no_answer(task):
    result = task.step(problem(), task.initial_state(problem()), "4 + 8 = 12 (left")
    assert result.valid and not result.terminal and result.answer is None
    assert not task.is_correct(problem(), None)


def test_verifier_scores(task):
    verifier = Game24OracleVerifier()
    assert verifier.name == "game24_oracle" and verifier.name in task.verifiers and task.verifiers[0] == "llm_value"
    live = task.step(problem(), task.initial_state(problem()), "4 + 8 = 12 (left")
    dead = task.step(problem(), task.initial_state(problem()), "4 * 8 = 32 (left")  # 4 6 32: no 24
    invalid = task.step(problem(), task.initial_state(problem()), "garbage")
    assert verifier.score(problem(), live) == 1.0
    assert verifier.score(problem(), dead) == DEAD_END_SCORE
    assert verifier.score(problem(), invalid) == 0.0
    assert verifier.describe(problem(), live) == {"left": ["4", "6", "12"]}
    assert verifier.describe(problem(), invalid) == {}


def test_state_is_immutable_and_json_friendly(task):
    state = task.initial_state(problem())
    assert isinstance(state, Game24State)
    with pytest.raises(AttributeError):
        state.steps = ("x",)  # type: ignore[misc]
    assert state.to_json() == {
        "inputs": [4, 4, 6, 8],
        "left": ["4", "4", "6", "8"],
        "expressions": ["4", "4", "6", "8"],
        "steps": [],
    }
