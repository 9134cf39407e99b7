"""GSM8K / MATH-500 / AIME: one data-driven task, three configs. Data slices, prompts, step parsing,
correctness, the answer verifier; the real files when the full data sets are present."""

from __future__ import annotations

import json

import pytest
from synthetic_data import SIZES

from arbor_cli.build import compose_config, instantiate_user
from arbor_runtime.tasks.base import Problem, StepResult
from arbor_runtime.tasks.data import DataUnavailable
from arbor_runtime.tasks.stepwise import StepwiseState, StepwiseTask, format_example
from arbor_runtime.verifiers.answer_match import AnswerVerifier

NAMES = ("aime", "gsm8k", "math500")
FULL_SIZES = {"gsm8k": 1319, "math500": 500, "aime": 60}
_CONFIGS = {name: compose_config([f"task={name}"]).task for name in NAMES}


def make(name: str, data_dir, **kwargs) -> StepwiseTask:
    """The task as its config builds it, over ``data_dir``, with ``kwargs`` overriding config values."""
    return instantiate_user(_CONFIGS[name], data_dir=str(data_dir), **kwargs)


def play(task: StepwiseTask, problem: Problem, thoughts: list[str]) -> list[StepResult]:
    """Apply ``thoughts`` in order from the initial state; every result."""
    state, results = task.initial_state(problem), []
    for thought in thoughts:
        results.append(task.step(problem, state, thought))
        state = results[-1].state
    return results


# --- data ---------------------------------------------------------------------------------------


def test_the_three_configs_build_one_class(data_dir):
    tasks = [make(name, data_dir, end=1) for name in NAMES]
    assert {type(t) for t in tasks} == {StepwiseTask}
    assert [t.name for t in tasks] == list(NAMES)
    assert all(t.verifiers == ("answer_match", "llm_value") and t.value_prompt is not None for t in tasks)


def test_gsm8k_slice_loads_rows(data_dir):
    task = make("gsm8k", data_dir, start=0, end=3)
    problems = task.problems()
    assert [p.index for p in problems] == [0, 1, 2]
    assert problems[0].question.startswith("A farmer has 12 hens")
    assert [p.answer for p in problems] == ["34", "2500", "-10"]  # after "####", commas removed
    assert problems[0].meta == {"split": "test"}
    assert task.data_origin == str(data_dir / "gsm8k" / "test.jsonl")


def test_gsm8k_train_split_and_task_folder_as_data_dir(data_dir):
    task = make("gsm8k", data_dir / "gsm8k", split="train", start=1)
    assert [p.index for p in task.problems()] == [1, 2]
    assert task.data_origin == str(data_dir / "gsm8k" / "train.jsonl")


def test_math500_and_aime_rows_carry_meta(data_dir):
    math = make("math500", data_dir, start=0, end=1).problems()[0]
    assert math.answer == "\\frac{5}{6}"
    assert set(math.meta) == {"subject", "level", "unique_id", "split"}
    aime = make("aime", data_dir, start=1, end=2).problems()[0]
    assert aime.answer == "010" and aime.meta == {"id": "aime_2024_I_2", "contest": "aime_2024_I", "split": "test"}


@pytest.mark.parametrize("name", NAMES)
def test_whole_files_load(name, data_dir):
    assert len(make(name, data_dir).problems()) == SIZES[name]


@pytest.mark.parametrize("name", NAMES)
def test_bad_slices_are_rejected_clearly(name, data_dir):
    size = SIZES[name]
    with pytest.raises(ValueError, match=f"{name}: task.end={size + 1} is past the last row; the file has {size}"):
        make(name, data_dir, end=size + 1)
    with pytest.raises(ValueError, match=f"{name}: task.start=2 is greater than task.end=1"):
        make(name, data_dir, start=2, end=1)
    with pytest.raises(ValueError, match="must be >= 0"):
        make(name, data_dir, start=-1)


@pytest.mark.parametrize("name", NAMES)
def test_missing_data_names_the_paths_and_the_setting(name, tmp_path):
    with pytest.raises(DataUnavailable, match="paths.data_dir") as err:
        make(name, tmp_path)
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


def test_bad_options_are_rejected(data_dir):
    with pytest.raises(ValueError, match="split 'dev' is not one of"):
        make("gsm8k", data_dir, split="dev")
    with pytest.raises(ValueError, match="task.step='word' is not one of"):
        make("aime", data_dir, step="word")
    with pytest.raises(ValueError, match="task.max_steps=0 must be >= 1"):
        make("math500", data_dir, max_steps=0)
    with pytest.raises(ValueError, match="task.max_thought_tokens=0"):
        make("math500", data_dir, max_thought_tokens=0)
    with pytest.raises(ValueError, match="task.answer='words' is not one of"):
        make("gsm8k", data_dir, answer="words")


def test_malformed_rows_name_file_and_line(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "x"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl:2: missing field\(s\) \['answer'\]"):
        make("math500", tmp_path)
    (tmp_path / "test.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="test.jsonl:1: not valid JSON"):
        make("math500", tmp_path)


# --- prompt and settings ------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_prompt_ends_with_the_question(name, data_dir):
    task = make(name, data_dir, end=1)
    problem = task.problems()[0]
    prompt = task.prompt(problem)
    assert prompt.startswith(task.instruction)
    assert prompt.endswith(format_example(problem.question))
    assert prompt.endswith("\nSolution:\n") and problem.question.strip() in prompt
    assert all(format_example(e.question, e.steps) in prompt for e in task.examples)
    assert len(task.examples) == 2


def test_defaults_and_step_kinds(data_dir):
    assert [make(n, data_dir, end=1).max_steps for n in ("gsm8k", "math500", "aime")] == [8, 10, 12]
    assert make("gsm8k", data_dir, end=1).max_thought_tokens == 64
    assert make("gsm8k", data_dir, end=1).stop == ("\n",)
    assert make("gsm8k", data_dir, end=1, step="sentence").stop == (". ", ".\n", "\n")


@pytest.mark.parametrize("step", ["line", "sentence"])
@pytest.mark.parametrize("name", NAMES)
def test_worked_examples_replay(name, step, data_dir):
    """Every example step is valid, only the last is terminal, and it states the example's answer."""
    task = make(name, data_dir, end=1, step=step)
    for example in task.examples:
        problem = Problem(0, example.question, example.answer)
        results = play(task, problem, list(example.steps))
        assert all(r.valid and r.forced_text == "" for r in results)
        assert [r.terminal for r in results] == [False] * (len(results) - 1) + [True]
        assert task.is_correct(problem, results[-1].answer)
        if step == "sentence":
            assert all(". " not in s for s in example.steps)  # one sentence per line


# --- step ---------------------------------------------------------------------------------------


def test_step_appends_stripped_thoughts(data_dir):
    task = make("gsm8k", data_dir, end=1)
    problem = task.problems()[0]
    results = play(task, problem, ["  He has 12 + 5 = 17 hens.\n", "They lay 17 * 2 = 34 eggs."])
    assert results[-1].state == StepwiseState(("He has 12 + 5 = 17 hens.", "They lay 17 * 2 = 34 eggs."))
    assert not results[-1].terminal and results[-1].answer is None
    assert results[-1].state.to_json() == {"steps": list(results[-1].state.steps), "answer": None}


@pytest.mark.parametrize("thought", ["", "   ", "\n"])
def test_empty_thought_is_invalid(thought, data_dir):
    task = make("aime", data_dir, end=1)
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
def test_answer_line_is_terminal(name, thought, answer, data_dir):
    task = make(name, data_dir, end=1)
    problem = task.problems()[0]
    result = play(task, problem, ["First step.", thought])[-1]
    assert result.valid and result.terminal
    assert result.answer == answer == result.state.answer
    assert len(result.state.steps) == 2


def test_max_steps_ends_the_path_without_an_answer(data_dir):
    task = make("gsm8k", data_dir, end=1, max_steps=3)
    problem = task.problems()[0]
    results = play(task, problem, ["One.", "Two 2.", "Three 3."])
    assert [r.terminal for r in results] == [False, False, True]
    assert results[-1].answer is None and not task.is_correct(problem, results[-1].answer)
    last = play(task, problem, ["One.", "Two.", "The answer is 34."])[-1]
    assert last.terminal and task.is_correct(problem, last.answer)


# --- correctness --------------------------------------------------------------------------------

#: (task, row, a right final step, a wrong one) on the synthetic rows
CASES = [
    ("gsm8k", 0, "The answer is 34.", "The answer is 43."),
    ("gsm8k", 1, "The answer is $2,500.", "The answer is 2,050."),
    ("gsm8k", 2, "The answer is -10.", "The answer is 10."),
    ("math500", 0, "The answer is $\\boxed{\\dfrac{5}{6}}$.", "The answer is $\\boxed{\\frac{6}{5}}$."),
    ("math500", 2, "The answer is $\\boxed{(2, \\frac{\\pi}{2})}$.", "The answer is $\\boxed{(2, \\pi)}$."),
    ("math500", 3, "The answer is $\\boxed{3.5}$.", "The answer is $\\boxed{3.05}$."),
    ("aime", 1, "The answer is 10.", "The answer is 100."),
]


@pytest.mark.parametrize(("name", "index", "right", "wrong"), CASES)
def test_is_correct_on_rows(name, index, right, wrong, data_dir):
    task = make(name, data_dir, start=index, end=index + 1)
    problem = task.problems()[0]
    assert task.is_correct(problem, task.step(problem, task.initial_state(problem), right).answer)
    assert not task.is_correct(problem, task.step(problem, task.initial_state(problem), wrong).answer)


# --- verifier -----------------------------------------------------------------------------------


def test_answer_verifier_scores_without_the_reference(data_dir):
    task, verifier = make("gsm8k", data_dir, end=1), AnswerVerifier()
    problem = task.problems()[0]
    blind = Problem(problem.index, problem.question, answer=None)
    cases = {
        "": 0.0,
        "They have 17 hens.": 0.5,
        "The answer is 34.": 1.0,
        "The answer is 99.": 1.0,  # wrong but stated: the verifier never checks the reference
        "The answer is unknown.": 0.1,
    }
    for thought, score in cases.items():
        result = task.step(problem, task.initial_state(problem), thought)
        assert verifier.score(problem, result) == score == verifier.score(blind, result)
    done = task.step(problem, task.initial_state(problem), "The answer is 34.")
    assert verifier.describe(problem, done) == {"answer": "34"}
    assert verifier.describe(problem, task.step(problem, task.initial_state(problem), "Step.")) == {}
    assert verifier.name == "answer_match"


def test_answer_verifier_scores_a_path_that_runs_out_of_steps(data_dir):
    task, verifier = make("math500", data_dir, end=1, max_steps=1), AnswerVerifier()
    problem = task.problems()[0]
    assert verifier.score(problem, task.step(problem, task.initial_state(problem), "We compute r = 3.")) == 0.1


# --- the real files -----------------------------------------------------------------------------

#: (task, row, right, wrong) on real rows of the full data sets (inlined under tests/fixtures)
FULL_CASES = [
    ("gsm8k", 0, "The answer is 18.", "The answer is 16."),
    ("gsm8k", 146, "The answer is $2,125.", "The answer is 2,152."),
    ("math500", 2, "The answer is $\\boxed{\\dfrac{14}{3}}$.", "The answer is $\\boxed{\\frac{3}{14}}$."),
    ("math500", 0, "The answer is $\\boxed{(3, \\frac{\\pi}{2})}$.", "The answer is $\\boxed{(3, \\pi)}$."),
    ("math500", 8, "The answer is $\\boxed{\\sqrt{117}}$.", "The answer is $\\boxed{3\\sqrt{3}}$."),
    ("aime", 1, "The answer is 25.", "The answer is 52."),
]


@pytest.mark.parametrize("name", NAMES)
def test_full_files_load(name, full_data):
    assert len(make(name, full_data).problems()) == FULL_SIZES[name]


def test_full_rows_and_meta(full_data):
    gsm = make("gsm8k", full_data, start=0, end=3).problems()
    assert gsm[0].question.startswith("Janet") and [p.answer for p in gsm] == ["18", "3", "70000"]
    assert [p.index for p in make("gsm8k", full_data / "gsm8k", split="train", start=7470).problems()] == [
        7470,
        7471,
        7472,
    ]
    assert make("math500", full_data, start=2, end=3).problems()[0].answer == "\\frac{14}{3}"
    aime = make("aime", full_data, start=1, end=2).problems()[0]
    assert aime.answer == "025" and aime.meta == {"id": "aime_2024_I_2", "contest": "aime_2024_I", "split": "test"}


#: where each task reads its test rows under a data dir
TEST_FILES = {"gsm8k": "gsm8k/test.jsonl", "math500": "math500/test.jsonl", "aime": "aime/aime_2024_2025.jsonl"}


@pytest.mark.parametrize(("name", "index", "right", "wrong"), FULL_CASES)
def test_is_correct_on_real_rows(name, index, right, wrong, real_rows, tmp_path):
    """The real row (inlined under tests/fixtures), as the one row of a data dir's test file."""
    path = tmp_path / TEST_FILES[name]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(real_rows[name][index]) + "\n", encoding="utf-8")
    task = make(name, tmp_path, start=0, end=1)
    problem = task.problems()[0]
    assert task.is_correct(problem, task.step(problem, task.initial_state(problem), right).answer)
    assert not task.is_correct(problem, task.step(problem, task.initial_state(problem), wrong).answer)
