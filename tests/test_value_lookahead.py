"""Lookahead in the value prompt (issue 50's third widening): the model writes up to k trial lines
before its verdict, as ToT's own value prompt does; k = 0 is the verdict-first prompt, unchanged."""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

import pytest
from rich.console import Console

from arbor_cli.build import compose_config
from arbor_cli.run import run
from arbor_runtime import Runtime
from arbor_runtime.tasks.game24 import (
    MAX_LOOKAHEAD,
    VALUE_EXAMPLES,
    VALUE_HEADER,
    VALUE_TRIALS,
    Game24Task,
    Game24ValuePrompt,
    exact_trial,
)
from arbor_runtime.tasks.stepwise import StepwiseValuePrompt
from arbor_runtime.verifiers import LLMValueVerifier
from arbor_runtime.verifiers.llm_value import VALUE_MAP

pytestmark = pytest.mark.usefixtures("one_torch_thread")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def value_of(expr: str) -> tuple[Fraction, list[int]]:
    """An arithmetic expression's exact value and the numbers it uses."""
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp):
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant)
        used.append(node.value)
        return Fraction(node.value)

    return walk(ast.parse(expr, mode="eval").body), used


def test_every_trial_is_right_and_a_sure_example_reaches_24_first():
    """The examples' trials are what they say (exact arithmetic over exactly the example's numbers);
    a "sure" example's first trial makes 24, the others' never do."""
    for numbers, verdict in VALUE_EXAMPLES:
        for i, trial in enumerate(VALUE_TRIALS[numbers]):
            expr, said = trial.rsplit(" = ", 1)
            value, used = value_of(expr)
            assert value == Fraction(said), trial
            assert sorted(used) == sorted(int(n) for n in numbers.split()), trial
            assert (value == 24) == (verdict == "sure" and i == 0), trial


def test_lookahead_zero_is_the_verdict_first_prompt_byte_for_byte(game24_problem):
    task, problem = game24_problem
    prompt = Game24ValuePrompt()
    assert prompt.prefix == VALUE_HEADER + "".join(f"Input: {n}\nJudgement: {v}\n" for n, v in VALUE_EXAMPLES)
    assert prompt.with_lookahead(0) is prompt and task.value_prompt.lookahead == 0
    state = task.initial_state(problem)
    assert prompt.query(problem, state).text == "Input: 4 5 6 10\nJudgement:"


def test_a_deeper_prompt_shows_that_many_trials_and_leaves_the_query_open(game24_problem):
    task, problem = game24_problem
    two = Game24ValuePrompt().with_lookahead(2)
    assert two.lookahead == 2 and two.verdict_cue == "Judgement:"
    assert "Input: 3 5\nTrial: 3 + 5 = 8\nTrial: 3 * 5 = 15\nJudgement: impossible\n" in two.prefix
    assert "Input: 6 4\nTrial: 6 * 4 = 24\nJudgement: sure\n" in two.prefix  # a sure one stops at 24
    assert "5 - 3 = 2" not in two.prefix and two.examples_span() == (len(VALUE_HEADER), len(two.prefix))
    query = two.query(problem, task.initial_state(problem))
    assert query.text == "Input: 4 5 6 10\n" and query.key == ("game24", "4 5 6 10")  # same key: one cache
    assert two.trials("Trial: 4 + 5 + 6 + 10 = 25\nTrial: 4 * 6 = 24\nTrial: x\n", query) == (
        "Trial: 4 + 5 + 6 + 10 = 25\nTrial: 4 * 6 = 24\n"
    )
    assert two.trials("Trial: 4 * 6 = 24\nJudgement", query) == "Trial: 4 * 6 = 24\n"  # the cue ends them
    assert two.trials("Trial: 4 * 6 =", query) == ""  # a line cut short is not kept
    assert two.trials("sure\nTrial: 4 * 6 = 24\n", query) == "" and two.trials("Trial:\n", query) == ""


def test_exact_trial_values_keep_only_checked_trials_with_the_tasks_arithmetic(game24_problem):
    """trial_values=exact: a trial of exactly the numbers left keeps its expression and gets its exact value;
    one over other numbers, or not an expression, is dropped (a later one still counts)."""
    task, problem = game24_problem
    three = Game24ValuePrompt(3)
    query = three.query(problem, task.step(problem, task.initial_state(problem), "6 - 5 = 1 (left").state)
    assert query.key == ("game24", "1 4 10")
    written = "Trial: 1 + 4 + 10 = 13\nTrial: 4 * 6 = 24\nTrial: (10 - 4) * 4 = 24\n"
    assert three.trials(written, query, exact=True) == "Trial: 1 + 4 + 10 = 15\n"  # 6 and 4 twice: dropped
    written = "Trial: (1 + 10) * 4 = 24\nTrial: 10 / (4 - 4) = 1\nTrial: 4 * 10 - 1 = 3 * 13\n"
    assert three.trials(written, query, exact=True) == "Trial: (1 + 10) * 4 = 44\nTrial: 4 * 10 - 1 = 39\n"
    assert exact_trial("10 * (4 - 1) = 30", "1 4 10") == "10 * (4 - 1) = 30"
    assert exact_trial("10 * 4 - 1", "1 4 10") == "10 * 4 - 1 = 39"  # no "=": the value is added
    assert exact_trial("2 / 3 * 36 = 24", "2/3 36") is None  # a fraction left is not a whole number
    assert exact_trial("__import__('os') = 1", "1 4 10") is None and exact_trial("1 + 4 ** 10", "1 4 10") is None


def test_trial_values_take_model_or_exact_and_exact_changes_what_the_verdict_reads(tiny, game24_problem):
    with pytest.raises(ValueError, match="verifier.trial_values='tool': valid: model, exact"):
        LLMValueVerifier(lookahead=1, trial_values="tool")
    task, problem = game24_problem
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(runtime=rt, prompt=task.value_prompt, lookahead=2, trial_values="exact")
    written: list[str] = []
    expand = rt.expand

    def script(node, n=1, sampling=None):  # the model's trials, as scripted text (the tiny model writes noise)
        kids = expand(node, n, sampling)
        kids[0].text = "Trial: 6 + 9 + 10 = 24\nTrial: 9 * 10 = 24\n"
        written.append(kids[0].text)
        return kids

    rt.expand = script
    result = task.step(problem, task.initial_state(problem), "4 + 5 = 9 (left")
    verifier.score(problem, result)
    assert verifier.describe(problem, result)["trials"] == "Trial: 6 + 9 + 10 = 25\n"  # checked, then corrected


@pytest.mark.parametrize("bad", [-1, MAX_LOOKAHEAD + 1, 1.5, True, "2"])
def test_bad_lookahead_is_refused_naming_what_is_valid(bad):
    with pytest.raises(ValueError, match="verifier.lookahead"):
        Game24ValuePrompt(bad)
    if not (isinstance(bad, int) and not isinstance(bad, bool) and bad > 0):
        with pytest.raises(ValueError, match="verifier.lookahead"):
            LLMValueVerifier(lookahead=bad)


def test_a_prompt_without_trials_and_sample_mode_refuse_lookahead(game24_problem):
    with pytest.raises(ValueError, match=r"lookahead=1: this task.s value prompt has no trial lines; valid: 0"):
        StepwiseValuePrompt().with_lookahead(1)
    with pytest.raises(ValueError, match="needs verifier.mode=choose"):
        LLMValueVerifier(lookahead=1, mode="sample")
    task, _ = game24_problem
    LLMValueVerifier(lookahead=MAX_LOOKAHEAD).check_task(task)  # fits game24
    with pytest.raises(ValueError, match="valid for game24: an integer 0-3"):
        LLMValueVerifier(lookahead=MAX_LOOKAHEAD + 1).check_task(task)


def test_the_verdict_is_scored_after_the_models_own_trials(tiny, game24_problem):
    """With lookahead the model writes its trials greedily under the deeper prefix, in a block released
    afterwards; the verdicts' probabilities are those after query + trials + cue, as a reference runtime
    that appends the same text computes them."""
    task, problem = game24_problem
    rt = Runtime(tiny, seed=0)
    verifier = LLMValueVerifier(runtime=rt, prompt=task.value_prompt, lookahead=2)
    assert verifier.prompt.lookahead == 2 and task.value_prompt.lookahead == 0  # the task's own is untouched
    written: list[str] = []
    expand = rt.expand

    def spy(node, n=1, sampling=None):
        kids = expand(node, n, sampling)
        assert sampling.greedy and sampling.max_new_tokens == 2 * 24 and "Judgement:" in sampling.stop
        written.extend(k.text for k in kids)
        return kids

    rt.expand = spy
    result = task.step(problem, task.initial_state(problem), "4 + 5 = 9 (left")
    score = verifier.score(problem, result)
    assert len(written) == 1  # one greedy continuation per state
    trials = verifier.prompt.trials(written[0], verifier.prompt.query(problem, result.state))
    text = "Input: 6 9 10\n" + trials + "Judgement:"
    ref = Runtime(tiny, seed=0)
    query = ref.append(ref.new_tree(verifier.prompt.prefix), text)
    totals = {v: sum(ref.append(query, f" {v}").logprobs) for v in VALUE_MAP}
    z = sum(math.exp(t) for t in totals.values())
    probs = {v: math.exp(t) / z for v, t in totals.items()}
    described = verifier.describe(problem, result)
    assert described["verdict_probs"] == pytest.approx(probs, rel=1e-4) and described["trials"] == trials
    assert score == pytest.approx(sum(p * VALUE_MAP[v] for v, p in probs.items()) / 20, rel=1e-4)
    assert verifier.roots[verifier.prompt.prefix].children == []  # trials and query released
    assert verifier.score(problem, result) == score and len(written) == 1  # cached: nothing written again


def test_the_console_script_takes_lookahead_and_refuses_it_where_no_trials_exist(data_dir, tmp_path, capsys):
    common = ["model=tiny-random", f"paths.data_dir={data_dir}", "task.start=900", "task.end=901"]
    gsm8k = ["model=tiny-random", f"paths.data_dir={data_dir}", "task=gsm8k", "task.start=0", "task.end=1"]
    assert run(compose_config([*gsm8k, "verifier=llm_value", "verifier.lookahead=1"])) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "verifier.lookahead=1" in err and "valid: 0" in err
    assert run(compose_config([*common, "verifier.lookahead=7"])) == 2
    assert "valid for game24: an integer 0-3" in capsys.readouterr().err
    run_dir = tmp_path / "run"
    args = [*common, "controller.breadth=1", "controller.n_generate=2", "verifier.lookahead=1", f"run_dir={run_dir}"]
    assert run(compose_config(args), Console(width=100)) == 0
    assert (run_dir / "results.jsonl").read_text().count("\n") == 1


@pytest.fixture
def game24_problem():
    task = Game24Task(start=900, end=901)  # the packaged puzzle file: rank 901, "4 5 6 10"
    return task, task.problems()[0]
