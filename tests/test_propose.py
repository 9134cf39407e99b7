"""Game of 24 propose modes (legal steps ranked by rt.choose, grammar-constrained samples) and the
likelihood verifier, through the controllers on the tiny model."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from itertools import permutations

import pytest

from arbor_cli.build import build_task, compose_config
from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.controllers import BFSController
from arbor_runtime.tasks.arith24 import apply_op, format_number
from arbor_runtime.tasks.base import Problem, Proposal
from arbor_runtime.tasks.game24 import Game24State, Game24Task, Operand, legal_steps, step_regex
from arbor_runtime.tasks.stepwise import answer_line_grammar
from arbor_runtime.verifiers.likelihood import LikelihoodVerifier, path_likelihood
from arbor_runtime.verifiers.llm_value import LLMValueVerifier

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def state(*numbers) -> Game24State:
    ops = tuple(sorted(Operand(Fraction(n), str(n)) for n in numbers))
    return Game24State(inputs=tuple(int(Fraction(n)) for n in numbers), remaining=ops)


@pytest.mark.parametrize(
    ("numbers", "expected"),
    [
        ((4, 6), ["4 + 6 = 10 (left: 10)", "4 - 6 = -2 (left: -2)", "6 - 4 = 2 (left: 2)",
                  "4 * 6 = 24 (left: 24)", "4 / 6 = 2/3 (left: 2/3)", "6 / 4 = 3/2 (left: 3/2)"]),
        ((2, 2), ["2 + 2 = 4 (left: 4)", "2 - 2 = 0 (left: 0)", "2 * 2 = 4 (left: 4)", "2 / 2 = 1 (left: 1)"]),
        ((0, 5), ["0 + 5 = 5 (left: 5)", "0 - 5 = -5 (left: -5)", "5 - 0 = 5 (left: 5)", "0 * 5 = 0 (left: 0)",
                  "0 / 5 = 0 (left: 0)"]),
        ((3, 3, 8), ["3 + 3 = 6 (left: 6 8)", "3 - 3 = 0 (left: 0 8)", "3 * 3 = 9 (left: 8 9)",
                     "3 / 3 = 1 (left: 1 8)", "3 + 8 = 11 (left: 3 11)", "3 - 8 = -5 (left: -5 3)",
                     "8 - 3 = 5 (left: 3 5)", "3 * 8 = 24 (left: 3 24)", "3 / 8 = 3/8 (left: 3/8 3)",
                     "8 / 3 = 8/3 (left: 8/3 3)"]),
    ],
)  # fmt: skip
def test_legal_steps_of_hand_checked_states(numbers, expected):
    assert legal_steps(state(*numbers)) == [f"{line}\n" for line in expected]


@pytest.mark.parametrize("numbers", [(4, 5, 6, 10), (1, 1, 2, 2), (1, 5, 5, 5), (3, 4, 4, 13), ("1/5", 5, 5)])
def test_legal_steps_are_sound_and_complete(numbers):
    task, prob, st = Game24Task(start=900, end=901), Problem(0, "4 5 6 10"), state(*numbers)
    steps = legal_steps(st)
    assert len(set(steps)) == len(steps)
    for text in steps:  # sound: the task accepts every one, and the left part is the state after it
        result = task.step(prob, st, text)
        assert result.valid, (text, result.reason)
        assert result.forced_text in (
            "",
            f"Answer: {result.state.final_expression} = {result.state.to_json()['left'][0]}\n",
        )
    # complete: every (x, op, y) over two distinct entries, + and * written smaller first, is listed
    brute = set()
    for i, j in permutations(range(len(st.values)), 2):
        x, y = st.values[i], st.values[j]
        for op in "+-*/":
            if op == "/" and y == 0 or op in "+*" and x > y:
                continue
            rest = [v for k, v in enumerate(st.values) if k not in (i, j)]
            z = apply_op(x, op, y)
            left = " ".join(format_number(v) for v in sorted([*rest, z]))
            brute.add(f"{format_number(x)} {op} {format_number(y)} = {format_number(z)} (left: {left})\n")
    assert set(steps) == brute


def test_a_legal_step_with_a_wrong_left_part_is_invalid():
    task, prob = Game24Task(start=900, end=901), Problem(0, "4 5 6 10")
    result = task.step(prob, state(4, 5, 6, 10), "4 + 5 = 9 (left: 6 9 9)\n")
    assert not result.valid and result.reason == "wrong numbers left: (left: 6 9 9), not (left: 6 9 10)"


def test_propose_modes_and_bad_mode():
    st = state(4, 5, 6, 10)
    prob = Problem(0, "4 5 6 10")
    assert Game24Task(start=900, end=901).propose(prob, st) == Proposal()
    assert Game24Task(start=900, end=901, propose="legal").propose(prob, st).choices == tuple(legal_steps(st))
    regex = Game24Task(start=900, end=901, propose="grammar").propose(prob, st).regex
    assert (
        regex == step_regex(st)
        and re.fullmatch(regex, "10 - 4 = 6 (left")
        and not re.fullmatch(regex, "7 + 4 = 11 (left")
    )
    with pytest.raises(ValueError, match="task.propose='beam' must be one of sample, legal, grammar"):
        Game24Task(start=900, end=901, propose="beam")


def bfs(tiny, propose: str, verifier, **kwargs) -> tuple[BFSController, Runtime]:
    rt = Runtime(tiny, seed=0)
    task = Game24Task(start=900, end=901, n_shots=1, propose=propose)
    return BFSController(rt, task, verifier, **kwargs), rt


def test_legal_bfs_keeps_the_models_best_legal_steps(tiny):
    ctrl, rt = bfs(tiny, "legal", LLMValueVerifier(), n_generate=3, breadth=2, release_pruned=False)
    result = ctrl.solve(ctrl.task.problems()[0])
    assert result.steps == 3 and result.answer is not None  # every path is legal: it reaches one number
    thoughts = [n for n in rt.all_nodes.values() if n.parent is not None and n.meta.get("valid") is not None]
    assert thoughts and all(n.meta["valid"] and n.kind == "forced" for n in thoughts)
    root = ctrl.root
    first = [c for c in root.children]
    assert len(first) == 3 and rt.metrics.decode_tokens == 0  # nothing sampled: chosen, not generated
    scored = rt.choose(root, legal_steps(root.meta["state"]))
    assert [c.text for c in first] == [scored.choices[i] for i in scored.order[:3]]


def test_grammar_bfs_samples_steps_over_the_numbers_left(tiny):
    ctrl, rt = bfs(
        tiny, "grammar", LikelihoodVerifier(), n_generate=4, breadth=2, temperature=1.0, release_pruned=False
    )
    ctrl.solve(ctrl.task.problems()[0])
    first = [c for c in ctrl.root.children]
    assert len(first) == 4
    regex = step_regex(ctrl.root.meta["state"])
    assert all(re.fullmatch(regex, c.text) and c.stop_reason in ("stop", "grammar") for c in first)


def test_likelihood_scores_the_path_and_finished_paths_exactly(tiny):
    ctrl, rt = bfs(tiny, "legal", LikelihoodVerifier(), n_generate=2, breadth=1)
    result = ctrl.solve(ctrl.task.problems()[0])
    for node in rt.all_nodes.values():
        if node.value is not None and not node.meta.get("terminal"):
            lps = [lp for b in node.path()[1:] for lp in b.logprobs]
            assert node.value == pytest.approx(math.exp(sum(lps) / len(lps))) and 0 < node.value <= 1
    assert path_likelihood(ctrl.root) == 1.0
    assert result.best is not None and result.best.value == (1.0 if result.solved else 0.0)  # exact check
    with pytest.raises(ValueError, match="verifier=likelihood scores nodes"):
        LikelihoodVerifier().score(
            ctrl.problem, ctrl.task.step(ctrl.problem, ctrl.root.meta["state"], "4 + 5 = 9 (left")
        )


@pytest.mark.parametrize(
    ("rule", "text", "accepted"),
    [
        ("number", "The answer is 1,234.5.\n", True),
        ("number", "The answer is five.\n", False),
        ("number", "So 3 + 4 = 7.\n", True),
        ("integer", "The answer is 042.\n", True),
        ("integer", "The answer is 1000.\n", False),
        ("math", "The answer is $\\boxed{\\frac{1}{2}}$.\n", True),
        ("math", "The answer is $\\boxed{\\frac{1}{2}$.\n", False),
        ("math", "The answer is 3.\n", False),
        ("math", "Let x = 2.\n", True),
    ],
)
def test_answer_line_grammars(tiny, rule, text, accepted):
    matcher = Runtime(tiny).grammar.matcher(SamplingParams(grammar=answer_line_grammar(rule)))
    ids = tiny.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert (matcher.inner.try_consume_tokens(ids) == len(ids) and matcher.inner.is_accepting()) is accepted


def test_math_tasks_propose_under_the_answer_grammar_when_asked(data_dir):
    over = [f"paths.data_dir={data_dir}", "task.end=1"]
    plain = build_task(compose_config(["task=gsm8k", *over]))
    constrained = build_task(compose_config(["task=math500", "task.answer_grammar=true", *over]))
    prob = constrained.problems()[0]
    assert plain.propose(plain.problems()[0], plain.initial_state(prob)) == Proposal()
    assert constrained.propose(prob, constrained.initial_state(prob)) == Proposal(grammar=answer_line_grammar("math"))
    with pytest.raises(ValueError, match="task.answer_grammar=true needs task.step=line"):
        build_task(compose_config(["task=gsm8k", "task.answer_grammar=true", "task.step=sentence", *over]))
