"""Game of 24 in the Tree-of-Thoughts path style: one thought is one step line.

The model writes "x op y = z" and stops at "(left" (or at the end of the line); the task checks the
step with exact fractions and writes the "(left: ...)" part itself, plus the final "Answer:" line
once one number is left. The model thus never has to track the remaining numbers.

How the next steps are proposed (``propose``):

- ``sample``: the model writes each step freely (most of SmolLM2-135M's steps are not valid).
- ``grammar``: the model samples under a regex of the step syntax over this state's numbers,
  "x op y = z (left", x and y among the numbers left; the arithmetic is still the model's.
- ``legal``: the task lists every legal step "x op y = z (left: ...)" (a pair of numbers left, an
  operation; + and * in one order only, identical steps once) and the model ranks them
  (``Runtime.choose``): the best ``n`` become the children. Every step is then valid; which ones
  are tried is the model's choice.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

from arbor_runtime.tasks.arith24 import apply_op, check_expression, evaluate, format_number, parse_puzzle
from arbor_runtime.tasks.base import Problem, Proposal, StepResult, Task, ValuePrompt, ValueQuery
from arbor_runtime.tasks.data import DataUnavailable, check_slice, find_file, read_rows

INSTRUCTION = (
    "Use numbers and basic arithmetic operations (+ - * /) to obtain 24. "
    "In each step, combine two of the remaining numbers into a new number."
)

#: worked examples in the exact format the task itself writes (see tests: each is replayed)
FEW_SHOT_EXAMPLES: tuple[str, ...] = (
    (
        "Input: 1 2 4 6\n"
        "Steps:\n"
        "2 - 1 = 1 (left: 1 4 6)\n"
        "4 * 6 = 24 (left: 1 24)\n"
        "1 * 24 = 24 (left: 24)\n"
        "Answer: (2 - 1) * (4 * 6) = 24\n"
    ),
    (
        "Input: 2 4 10 12\n"
        "Steps:\n"
        "12 / 4 = 3 (left: 2 3 10)\n"
        "10 - 2 = 8 (left: 3 8)\n"
        "3 * 8 = 24 (left: 24)\n"
        "Answer: (12 / 4) * (10 - 2) = 24\n"
    ),
    (
        "Input: 2 6 7 13\n"
        "Steps:\n"
        "13 - 7 = 6 (left: 2 6 6)\n"
        "6 + 6 = 12 (left: 2 12)\n"
        "2 * 12 = 24 (left: 24)\n"
        "Answer: 2 * (6 + (13 - 7)) = 24\n"
    ),
    (
        "Input: 3 4 7 10\n"
        "Steps:\n"
        "10 - 7 = 3 (left: 3 3 4)\n"
        "3 + 3 = 6 (left: 4 6)\n"
        "4 * 6 = 24 (left: 24)\n"
        "Answer: 4 * (3 + (10 - 7)) = 24\n"
    ),
    (
        "Input: 1 5 5 5\n"
        "Steps:\n"
        "1 / 5 = 1/5 (left: 1/5 5 5)\n"
        "5 - 1/5 = 24/5 (left: 24/5 5)\n"
        "5 * 24/5 = 24 (left: 24)\n"
        "Answer: 5 * (5 - (1 / 5)) = 24\n"
    ),
)

_LEFT_STOP = "(left"
_NUMBER = r"-?\d+(?:/\d+)?"
_OPS = {"+": "+", "-": "-", "*": "*", "/": "/", "×": "*", "÷": "/", "x": "*"}
_STEP = re.compile(
    rf"[ \t]*(?P<x>{_NUMBER})[ \t]+(?P<op>[-+*/×÷x])[ \t]+(?P<y>{_NUMBER})[ \t]*=[ \t]*(?P<z>{_NUMBER})"
    rf"(?P<rest>.*)",
    re.DOTALL | re.ASCII,
)
#: what may follow "x op y = z" in a thought: spaces, then the "(left" stop string, the whole
#: "(left: ...)" part and a newline (a legal-step proposal), or a newline
_STEP_END = re.compile(r"[ \t]*(?:\(left(?::(?P<left>[^)\n]*)\)\n)?|\n)?")
#: how the next steps are proposed (see the module docstring)
PROPOSE_MODES = ("sample", "legal", "grammar")

#: value prompt (ToT's game24 ``value_prompt``, verdict first): header and (numbers left, verdict)
#: examples written for this project; "likely" = in range, no quick way to 24
VALUE_HEADER = "Evaluate if given numbers can reach 24 (sure/likely/impossible)\n"
VALUE_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("3 5", "impossible"),
    ("6 4", "sure"),
    ("4 5 7", "likely"),
    ("13 13 13", "impossible"),
    ("2 10 12", "sure"),
    ("1 1 2", "impossible"),
    ("3 9 10", "likely"),
    ("7 8 10", "sure"),
)
#: each example's trials, written out in ToT's style (a whole expression over the numbers and its value),
#: shown before the verdict when the prompt has lookahead: the first ``lookahead`` of them (a "sure"
#: example reaches 24 in its first trial, so every depth shows why it is sure)
VALUE_TRIALS: dict[str, tuple[str, ...]] = {
    "3 5": ("3 + 5 = 8", "3 * 5 = 15", "5 - 3 = 2"),
    "6 4": ("6 * 4 = 24",),
    "4 5 7": ("4 + 5 + 7 = 16", "4 * 7 - 5 = 23", "(7 - 5) * 4 = 8"),
    "13 13 13": ("13 + 13 + 13 = 39", "13 * 13 / 13 = 13", "13 + 13 - 13 = 13"),
    "2 10 12": ("2 + 10 + 12 = 24",),
    "1 1 2": ("1 + 1 + 2 = 4", "(1 + 1) * 2 = 4", "1 * 1 * 2 = 2"),
    "3 9 10": ("3 + 9 + 10 = 22", "10 * 3 - 9 = 21", "9 * 3 - 10 = 17"),
    "7 8 10": ("(10 - 7) * 8 = 24",),
}
#: the most trial lines a value query may have (the examples show up to this many)
MAX_LOOKAHEAD = max(len(t) for t in VALUE_TRIALS.values())
#: how one trial line starts, and the verdict's cue
TRIAL_MARK, VERDICT_CUE = "Trial:", "Judgement:"


class Operand(NamedTuple):
    """One remaining number and the expression over the inputs that built it."""

    value: Fraction
    expr: str


@dataclass(frozen=True, slots=True)
class Game24State:
    """Numbers left on one path (sorted ascending, exact) and the steps that led there."""

    inputs: tuple[int, ...]
    remaining: tuple[Operand, ...]
    steps: tuple[str, ...] = ()

    @property
    def values(self) -> tuple[Fraction, ...]:
        """The remaining numbers."""
        return tuple(o.value for o in self.remaining)

    @property
    def final_expression(self) -> str | None:
        """The expression of the last number (outer parentheses removed), or None if more are left."""
        if len(self.remaining) != 1:
            return None
        return _strip_outer_parens(self.remaining[0].expr)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for logs: inputs, numbers left as text, their expressions, steps taken."""
        return {
            "inputs": list(self.inputs),
            "left": [format_number(v) for v in self.values],
            "expressions": [o.expr for o in self.remaining],
            "steps": list(self.steps),
        }


def value_query(numbers: str) -> str:
    """One state's block of the value prompt: the numbers left; the model completes the verdict."""
    return f"Input: {numbers}\n{VERDICT_CUE}"


def trial_example(numbers: str, verdict: str, depth: int) -> str:
    """One example of the value prompt with ``depth`` trial lines (at most its own) before the verdict; depth
    0 is the verdict-first example, ``value_query(numbers)`` and the verdict."""
    tried = "".join(f"{TRIAL_MARK} {t}\n" for t in VALUE_TRIALS[numbers][:depth])
    return f"Input: {numbers}\n{tried}{VERDICT_CUE} {verdict}\n"


class Game24ValuePrompt(ValuePrompt):
    """Game of 24 value prompt: can the numbers left still make 24? Finished paths need no model.

    Args:
        lookahead: trial lines (whole expressions over the numbers left and their values, ToT's style)
            the model writes before its verdict, 0 to :data:`MAX_LOOKAHEAD`; 0 (default): verdict first.
    """

    verdict_cue = VERDICT_CUE

    def __init__(self, lookahead: int = 0) -> None:
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or not 0 <= lookahead <= MAX_LOOKAHEAD:
            raise ValueError(f"verifier.lookahead={lookahead!r}: valid for game24: an integer 0-{MAX_LOOKAHEAD}")
        self.lookahead = lookahead
        self.prefix = VALUE_HEADER + "".join(trial_example(n, v, lookahead) for n, v in VALUE_EXAMPLES)

    def with_lookahead(self, depth: int) -> Game24ValuePrompt:
        """This prompt with ``depth`` trial lines before each verdict."""
        return self if depth == self.lookahead else Game24ValuePrompt(depth)

    def examples_span(self) -> tuple[int, int]:
        """The verdict examples after the header line."""
        return len(VALUE_HEADER), len(self.prefix)

    def query(self, problem: Problem, state: Game24State) -> ValueQuery:
        """Keyed by the numbers left, so states reached in different orders share one evaluation. With
        lookahead the text ends after the numbers' line: the model writes its trials next."""
        numbers = " ".join(format_number(v) for v in state.values)
        text = value_query(numbers)
        return ValueQuery(("game24", numbers), text if self.lookahead == 0 else text.removesuffix(VERDICT_CUE))

    def trials(self, written: str, query: ValueQuery, exact: bool = False) -> str:
        """The leading whole lines of ``written`` that are trials ("Trial: ..."), at most :attr:`lookahead`,
        each ending in a newline; the rest (a verdict, another input, a line cut short) is dropped.

        ``exact``: a trial is kept only when its expression uses exactly the numbers left (``query``'s key)
        with + - * /, and its value is the exact one (:func:`exact_trial`), whatever the model wrote after "="."""
        kept = []
        for line in written.split("\n")[:-1][: self.lookahead]:  # whole lines only
            body = line.removeprefix(TRIAL_MARK).strip()
            if not line.startswith(TRIAL_MARK) or not body:
                break
            if exact:
                body = exact_trial(body, query.key[1])
                if body is None:
                    continue
                line = f"{TRIAL_MARK} {body}"
            kept.append(line + "\n")
        return "".join(kept)

    def finished_score(self, problem: Problem, result: StepResult) -> float:
        """1.0 when the final expression uses the inputs once and equals 24, else 0.0 (exact)."""
        answer = result.answer
        return 1.0 if answer is not None and check_expression(answer, parse_puzzle(problem.question)) else 0.0


def exact_trial(trial: str, numbers: str) -> str | None:
    """``"3 + 4 + 9 = 18"`` over numbers ``"3 4 9"`` -> ``"3 + 4 + 9 = 16"``: the expression before "=" with its
    exact value; None when it is not an expression of exactly those (whole) numbers with + - * /."""
    expr = trial.split("=", 1)[0].strip()
    found = evaluate(expr)
    if found is None or sorted(str(n) for n in found[1]) != sorted(numbers.split()):
        return None
    return f"{expr} = {format_number(found[0])}"


def find_data_file(data_dir: str | Path | None) -> Path:
    """``24.csv`` under ``data_dir`` (or its ``game24/`` folder); the ``tot`` package copy if None.

    An explicit ``data_dir`` without the file is an error (no silent fallback), naming both paths.
    """
    if data_dir is not None:
        return find_file(data_dir, "game24", "24.csv")
    path = _package_csv()
    if path is None or not path.is_file():
        where = path or "the tree-of-thoughts-llm package (not installed)"
        raise DataUnavailable(
            f"data file game24/24.csv not found; looked at: {where}. "
            "Set paths.data_dir (or task.data_dir) to a folder holding it, or pip install --no-deps "
            "tree-of-thoughts-llm (see README: Data)."
        )
    return path


class Game24Task(Task):
    """Game of 24 over a row slice of ``24.csv`` (default rows 900..999 = ToT ranks 901-1000)."""

    name = "game24"
    stop = (_LEFT_STOP, "\n")
    max_thought_tokens = 24
    max_steps = 3
    #: the model's value (the default), its path likelihood, and the exact solver (an upper bound only)
    verifiers = ("llm_value", "likelihood", "game24_oracle")
    value_prompt = Game24ValuePrompt()

    def __init__(
        self,
        data_dir: str | None = None,
        start: int = 900,
        end: int | None = 1000,
        n_shots: int = 5,
        propose: str = "sample",
    ) -> None:
        if not 0 <= n_shots <= len(FEW_SHOT_EXAMPLES):
            raise ValueError(f"game24: n_shots={n_shots} must be in 0..{len(FEW_SHOT_EXAMPLES)}")
        if propose not in PROPOSE_MODES:
            raise ValueError(f"game24: task.propose={propose!r} must be one of {', '.join(PROPOSE_MODES)}")
        self.n_shots, self.propose_mode = n_shots, propose
        self.data_file = find_data_file(data_dir)
        rows = read_rows(self.data_file, ("Puzzles",))
        self.start, self.end = check_slice(start, end, len(rows), self.name)
        self._problems = [_problem(i, rows[i]) for i in range(self.start, self.end)]

    def problems(self) -> list[Problem]:
        """The problems of the configured slice, in file order."""
        return list(self._problems)

    def prompt(self, problem: Problem) -> str:
        """Instruction, ``n_shots`` worked examples, then "Input: a b c d\\nSteps:\\n"."""
        numbers = " ".join(map(str, parse_puzzle(problem.question)))
        blocks = [INSTRUCTION + "\n", *FEW_SHOT_EXAMPLES[: self.n_shots], f"Input: {numbers}\nSteps:\n"]
        return "\n".join(blocks)

    def examples_span(self, problem: Problem) -> tuple[int, int] | None:
        """The ``n_shots`` worked examples, between the instruction and "Input: ..." (None without shots)."""
        if not self.n_shots:
            return None
        start = len(INSTRUCTION + "\n") + 1
        return start, start + len("\n".join(FEW_SHOT_EXAMPLES[: self.n_shots])) + 1

    def initial_state(self, problem: Problem) -> Game24State:
        """The four inputs, each its own expression."""
        inputs = parse_puzzle(problem.question)
        remaining = tuple(sorted(Operand(Fraction(n), str(n)) for n in inputs))
        return Game24State(inputs=inputs, remaining=remaining)

    def step(self, problem: Problem, state: Game24State, thought: str) -> StepResult:
        """Apply "x op y = z" from the start of ``thought``; invalid keeps ``state`` and forces nothing.

        Once one number is left the path is terminal and its answer is that number's expression.
        """
        try:
            new_state = _apply_step(state, thought)
        except ValueError as err:
            return StepResult(state=state, valid=False, reason=str(err))
        answer = new_state.final_expression
        forced = _forced_text(thought, new_state)
        return StepResult(state=new_state, forced_text=forced, terminal=answer is not None, answer=answer)

    def is_correct(self, problem: Problem, answer: str | None) -> bool:
        """Whether the final expression uses the four inputs exactly once and equals 24."""
        return answer is not None and check_expression(answer, parse_puzzle(problem.question))

    def propose(self, problem: Problem, state: Game24State) -> Proposal:
        """Free samples, samples under :func:`step_regex`, or the :func:`legal_steps` to rank (``propose``)."""
        if self.propose_mode == "legal":
            return Proposal(choices=tuple(legal_steps(state)))
        if self.propose_mode == "grammar":
            return Proposal(regex=step_regex(state))
        return Proposal()

    def state_key(self, state: Game24State) -> tuple[Fraction, ...]:
        """The multiset of numbers left (sorted): how they were made does not change what can follow."""
        return state.values


def legal_steps(state: Game24State) -> list[str]:
    """Every legal next step as the line the task would write: "x op y = z (left: ...)\n".

    One step per pair of numbers left and operation: + and * with the smaller number first only
    (the other order is the same step), - and / in both orders, no division by zero; steps that
    read the same (equal numbers) once. Order: pairs as the numbers are sorted, then + - * /.
    """
    values, steps = state.values, {}
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            a, b = values[i], values[j]
            rest = values[:i] + values[i + 1 : j] + values[j + 1 :]
            for x, op, y in ((a, "+", b), (a, "-", b), (b, "-", a), (a, "*", b), (a, "/", b), (b, "/", a)):
                if op == "/" and y == 0:
                    continue
                z = apply_op(x, op, y)
                left = " ".join(format_number(v) for v in sorted((*rest, z)))
                text = f"{_step_text(x, op, y, z)} (left: {left})\n"
                steps.setdefault(text, None)
    return list(steps)


def step_regex(state: Game24State) -> str:
    """The step syntax over ``state``'s numbers: "x op y = z (left", x and y among the numbers left."""
    numbers = "|".join(
        re.escape(format_number(v)) for v in sorted(set(state.values), key=lambda v: (-len(format_number(v)), v))
    )
    return rf"({numbers}) [-+*/] ({numbers}) = -?[0-9]{{1,4}}(/[0-9]{{1,4}})? \(left"


def _package_csv() -> Path | None:
    """``tot/data/24/24.csv`` of the installed ``tree-of-thoughts-llm``, found without importing it."""
    try:
        spec = importlib.util.find_spec("tot")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    candidates = [Path(loc) / "data" / "24" / "24.csv" for loc in locations]
    return next((p for p in candidates if p.is_file()), candidates[0] if candidates else None)


def _problem(index: int, row: dict[str, str]) -> Problem:
    """Problem for 0-based row ``index``; rank from the "Rank" column (index + 1 when absent)."""
    numbers = parse_puzzle(row["Puzzles"])
    rank = int(row.get("Rank") or index + 1)
    return Problem(index=index, question=" ".join(map(str, numbers)), meta={"rank": rank})


def _apply_step(state: Game24State, thought: str) -> Game24State:
    """State after the step at the start of ``thought``; ValueError saying why it is invalid."""
    match = _STEP.match(thought)
    if match is None:
        raise ValueError(f"malformed step {thought[:40]!r}: expected 'x op y = z', e.g. '4 + 8 = 12'")
    end = _STEP_END.fullmatch(match["rest"])
    if end is None:
        raise ValueError(f"unexpected text after the step: {match['rest'][:40]!r}")
    x, y, z = (_parse_number(match[k]) for k in ("x", "y", "z"))
    op = _OPS[match["op"]]
    left, right, rest = _take_two(state.remaining, x, y)
    try:
        value = apply_op(x, op, y)
    except ZeroDivisionError:
        raise ValueError(f"division by zero: {format_number(x)} / 0") from None
    if value != z:
        raise ValueError(f"wrong arithmetic: {_step_text(x, op, y, value)}, not {format_number(z)}")
    made = Operand(value, f"({left.expr} {op} {right.expr})")
    after = Game24State(
        inputs=state.inputs,
        remaining=tuple(sorted((*rest, made), key=lambda o: o.value)),
        steps=(*state.steps, _step_text(x, op, y, z)),
    )
    written = end["left"]
    if written is not None and written.split() != [format_number(v) for v in after.values]:
        left = " ".join(format_number(v) for v in after.values)
        raise ValueError(f"wrong numbers left: (left:{written}), not (left: {left})")
    return after


def _parse_number(text: str) -> Fraction:
    """An integer or "a/b" as an exact fraction; ValueError for a zero denominator."""
    try:
        return Fraction(text)
    except ZeroDivisionError:
        raise ValueError(f"bad number {text!r}: zero denominator") from None


def _take_two(remaining: tuple[Operand, ...], x: Fraction, y: Fraction) -> tuple[Operand, Operand, list[Operand]]:
    """Remove two distinct entries equal to ``x`` and ``y``; ValueError if they are not both there."""
    rest = list(remaining)
    taken = []
    for wanted in (x, y):
        index = next((i for i, o in enumerate(rest) if o.value == wanted), None)
        if index is None:
            left = " ".join(format_number(o.value) for o in remaining)
            raise ValueError(f"number {format_number(wanted)} is not among the remaining numbers: {left}")
        taken.append(rest.pop(index))
    return taken[0], taken[1], rest


def _step_text(x: Fraction, op: str, y: Fraction, z: Fraction) -> str:
    """Canonical step line without the left part: "4 + 8 = 12"."""
    return f"{format_number(x)} {op} {format_number(y)} = {format_number(z)}"


def _forced_text(thought: str, state: Game24State) -> str:
    """The "(left: ...)" part the task writes after ``thought``, plus "Answer: ..." when one is left."""
    left = " ".join(format_number(v) for v in state.values)
    if thought.endswith(")\n"):  # a legal-step proposal wrote the whole "(left: ...)" part
        text = ""
    elif thought.endswith(_LEFT_STOP):
        text = f": {left})\n"
    elif thought[-1:].isspace():
        text = f"(left: {left})\n"
    else:
        text = f" (left: {left})\n"
    if state.final_expression is not None:
        text += f"Answer: {state.final_expression} = {format_number(state.values[0])}\n"
    return text


def _strip_outer_parens(expr: str) -> str:
    """``expr`` without one pair of parentheses enclosing all of it ("(a + b)" -> "a + b")."""
    if not (expr.startswith("(") and expr.endswith(")")):
        return expr
    depth = 0
    for i, char in enumerate(expr):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and i < len(expr) - 1:
            return expr
    return expr[1:-1]
