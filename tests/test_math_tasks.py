"""GSM8K / MATH-500 / AIME tasks: data slices, prompts, step parsing, correctness, the answer verifier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.aime import AimeTask
from tasks.base import Problem, StepResult
from tasks.gsm8k import GSM8KTask
from tasks.math500 import Math500Task
from tasks.stepwise import StepwiseState, StepwiseTask, format_example
from verifiers.answer_match import AnswerVerifier

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TASKS = {"gsm8k": GSM8KTask, "math500": Math500Task, "aime": AimeTask}
SIZES = {"gsm8k": 1319, "math500": 500, "aime": 60}


def shared_data() -> Path:
    """The shared data root; the tests need it."""
    if not (SHARED_DATA / "math500" / "test.jsonl").is_file():
        pytest.fail(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def make(name: str, **kwargs) -> StepwiseTask:
    return TASKS[name](data_dir=str(shared_data()), **kwargs)


def play(task: StepwiseTask, problem: Problem, thoughts: list[str]) -> list[StepResult]:
    """Apply ``thoughts`` in order from the initial state; every result."""
    state, results = task.initial_state(problem), []
    for thought in thoughts:
        results.append(task.step(problem, state, thought))
        state = results[-1].state
    return results


# --- data ---------------------------------------------------------------------------------------


def test_gsm8k_slice_loads_real_rows():
    task = make("gsm8k", start=0, end=3)
    problems = task.problems()
    assert [p.index for p in problems] == [0, 1, 2]
    assert problems[0].question.startswith("Janet")
    assert [p.answer for p in problems] == ["18", "3", "70000"]
    assert problems[0].meta == {"split": "test"}


def test_gsm8k_train_split_and_task_folder_as_data_dir():
    task = GSM8KTask(data_dir=str(shared_data() / "gsm8k"), split="train", start=7470)
    assert [p.index for p in task.problems()] == [7470, 7471, 7472]
    assert task.data_file == shared_data() / "gsm8k" / "train.jsonl"


def test_math500_and_aime_rows_carry_meta():
    math = make("math500", start=2, end=3).problems()[0]
    assert math.answer == "\\frac{14}{3}"
    assert set(math.meta) == {"subject", "level", "unique_id"}
    aime = make("aime", start=1, end=2).problems()[0]
    assert aime.answer == "025" and aime.meta == {"id": "aime_2024_I_2", "contest": "aime_2024_I"}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_full_files_load(name):
    assert len(make(name).problems()) == SIZES[name]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_bad_slices_are_rejected_clearly(name):
    size = SIZES[name]
    with pytest.raises(ValueError, match=f"{name}: task.end={size + 1} is past the last row; the file has {size}"):
        make(name, end=size + 1)
    with pytest.raises(ValueError, match=f"{name}: task.start=5 is greater than task.end=2"):
        make(name, start=5, end=2)
    with pytest.raises(ValueError, match="must be >= 0"):
        make(name, start=-1)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_missing_data_names_task_data_dir(name, tmp_path):
    with pytest.raises(FileNotFoundError, match="task.data_dir"):
        TASKS[name]()
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        TASKS[name](data_dir=str(tmp_path))


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="task.split='dev' is not one of"):
        make("gsm8k", split="dev")
    with pytest.raises(ValueError, match="task.step='word' is not one of"):
        make("aime", step="word")
    with pytest.raises(ValueError, match="task.max_steps=0 must be >= 1"):
        make("math500", max_steps=0)
    with pytest.raises(ValueError, match="task.max_thought_tokens=0"):
        make("math500", max_thought_tokens=0)


def test_malformed_rows_name_file_and_line(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "x"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl:2: missing field\(s\) \['answer'\]"):
        Math500Task(data_dir=str(tmp_path))
    (tmp_path / "test.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="test.jsonl:1: not valid JSON"):
        Math500Task(data_dir=str(tmp_path))


# --- prompt and settings ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TASKS))
def test_prompt_ends_with_the_question(name):
    task = make(name, end=1)
    problem = task.problems()[0]
    prompt = task.prompt(problem)
    assert prompt.startswith(task.instruction)
    assert prompt.endswith(format_example(problem.question))
    assert prompt.endswith("\nSolution:\n") and problem.question.strip() in prompt
    assert all(format_example(e.question, e.steps) in prompt for e in task.examples)
    assert len(task.examples) == 2


def test_defaults_and_step_kinds():
    assert [make(n, end=1).max_steps for n in ("gsm8k", "math500", "aime")] == [8, 10, 12]
    assert make("gsm8k", end=1).max_thought_tokens == 64
    assert make("gsm8k", end=1).stop == ("\n",)
    assert make("gsm8k", end=1, step="sentence").stop == (". ", ".\n", "\n")


@pytest.mark.parametrize("step", ["line", "sentence"])
@pytest.mark.parametrize("name", sorted(TASKS))
def test_worked_examples_replay(name, step):
    """Every example step is valid, only the last is terminal, and it states the example's answer."""
    task = make(name, end=1, step=step)
    for example in task.examples:
        problem = Problem(0, example.question, example.answer)
        results = play(task, problem, list(example.steps))
        assert all(r.valid and r.forced_text == "" for r in results)
        assert [r.terminal for r in results] == [False] * (len(results) - 1) + [True]
        assert task.is_correct(problem, results[-1].state)
        if step == "sentence":
            assert all(". " not in s for s in example.steps)  # one sentence per line


# --- step ---------------------------------------------------------------------------------------


def test_step_appends_stripped_thoughts():
    task = make("gsm8k", end=1)
    problem = task.problems()[0]
    results = play(task, problem, ["  Janet has 16 - 3 - 4 = 9 eggs left.\n", "She makes 9 * 2 = $18."])
    assert results[-1].state == StepwiseState(("Janet has 16 - 3 - 4 = 9 eggs left.", "She makes 9 * 2 = $18."))
    assert not results[-1].terminal
    assert results[-1].state.to_json() == {"steps": list(results[-1].state.steps), "answer": None}


@pytest.mark.parametrize("thought", ["", "   ", "\n"])
def test_empty_thought_is_invalid(thought):
    task = make("aime", end=1)
    problem = task.problems()[0]
    state = StepwiseState(("a step",))
    result = task.step(problem, state, thought)
    assert not result.valid and not result.terminal and result.state is state and result.reason


@pytest.mark.parametrize(
    ("name", "thought", "answer"),
    [
        ("gsm8k", "The answer is 18.", "18"),
        ("gsm8k", "So she makes $18 a day. #### 18", "18"),
        ("gsm8k", "the answer is $1,250.", "1250"),
        ("gsm8k", "The answer is not clear.", None),
        ("math500", "The answer is $\\boxed{\\frac{14}{3}}$.", "\\frac{14}{3}"),
        ("math500", "So $f(-2) + f(-1) + f(0) = \\boxed{\\frac{14}{3}}$", "\\frac{14}{3}"),
        ("math500", "The answer is $\\frac{14}{3}$.", "\\frac{14}{3}"),
        ("aime", "The answer is 25.", "25"),
        ("aime", "Thus $xy = \\boxed{025}$.", "25"),
        ("aime", "The answer is 1000.", None),
    ],
)
def test_answer_line_is_terminal(name, thought, answer):
    task = make(name, end=1)
    problem = task.problems()[0]
    result = play(task, problem, ["First step.", thought])[-1]
    assert result.valid and result.terminal
    assert task.final_answer(problem, result.state) == answer
    assert len(result.state.steps) == 2


def test_max_steps_ends_the_path_without_an_answer():
    task = make("gsm8k", end=1, max_steps=3)
    problem = task.problems()[0]
    results = play(task, problem, ["One.", "Two 2.", "Three 3."])
    assert [r.terminal for r in results] == [False, False, True]
    assert task.final_answer(problem, results[-1].state) is None
    assert not task.is_correct(problem, results[-1].state)
    last = play(task, problem, ["One.", "Two.", "The answer is 18."])[-1]
    assert last.terminal and task.is_correct(problem, last.state)


# --- correctness on real rows -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "index", "right", "wrong"),
    [
        ("gsm8k", 0, "The answer is 18.", "The answer is 16."),
        ("gsm8k", 146, "The answer is $2,125.", "The answer is 2,152."),
        ("math500", 2, "The answer is $\\boxed{\\dfrac{14}{3}}$.", "The answer is $\\boxed{\\frac{3}{14}}$."),
        (
            "math500",
            0,
            "The answer is $\\boxed{(3, \\frac{\\pi}{2})}$.",
            "The answer is $\\boxed{(3, \\pi)}$.",
        ),
        ("math500", 8, "The answer is $\\boxed{\\sqrt{117}}$.", "The answer is $\\boxed{3\\sqrt{3}}$."),
        ("aime", 1, "The answer is 25.", "The answer is 52."),
    ],
)
def test_is_correct_on_real_rows(name, index, right, wrong):
    task = make(name, start=index, end=index + 1)
    problem = task.problems()[0]
    assert task.is_correct(problem, task.step(problem, task.initial_state(problem), right).state)
    assert not task.is_correct(problem, task.step(problem, task.initial_state(problem), wrong).state)


# --- verifier -----------------------------------------------------------------------------------


def test_answer_verifier_scores_without_the_reference():
    task, verifier = make("gsm8k", end=1), AnswerVerifier()
    problem = task.problems()[0]
    blind = Problem(problem.index, problem.question, answer=None)
    cases = {
        "": 0.0,
        "She has 9 eggs left.": 0.5,
        "The answer is 18.": 1.0,
        "The answer is 99.": 1.0,  # wrong but stated: the verifier never checks the reference
        "The answer is unknown.": 0.1,
    }
    for thought, score in cases.items():
        result = task.step(problem, task.initial_state(problem), thought)
        assert verifier.score(problem, result) == score == verifier.score(blind, result)
    done = task.step(problem, task.initial_state(problem), "The answer is 18.")
    assert verifier.describe(problem, done) == {"answer": "18"}
    assert verifier.describe(problem, task.step(problem, task.initial_state(problem), "Step.")) == {}
    assert verifier.name == "answer_match"


def test_answer_verifier_scores_a_path_that_runs_out_of_steps():
    task, verifier = make("math500", end=1, max_steps=1), AnswerVerifier()
    problem = task.problems()[0]
    assert verifier.score(problem, task.step(problem, task.initial_state(problem), "We compute r = 3.")) == 0.1
