"""Free-form math reasoning, one step per thought: GSM8K, MATH-500 and AIME as one data-driven task.

A thought is one line (``step="line"``) or one sentence (``step="sentence"``) of a worked solution.
The task keeps the steps so far; a step that states the final answer ("The answer is ...", "####",
"\\boxed") ends the path, and so does reaching ``max_steps``. The prompt is an instruction, worked
examples and the question, all rendered by ``format_example`` so examples and query share one format.

What differs between the data sets is data, given by each ``conf/task/<name>.yaml``: where the rows
are (:class:`~arbor_runtime.tasks.data.DataSource`), which fields hold the question and the answer, the answer
rule (:data:`~arbor_runtime.tasks.answers.ANSWER_RULES`), the instruction and the worked examples.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from arbor_runtime.tasks.answers import ANSWER_RULES
from arbor_runtime.tasks.base import Problem, Proposal, StepResult, Task, ValuePrompt, ValueQuery
from arbor_runtime.tasks.data import DataSource, check_slice, load_rows

#: stop strings of one thought, per step granularity
STEP_STOPS: dict[str, tuple[str, ...]] = {"line": ("\n",), "sentence": (". ", ".\n", "\n")}
#: a step matching this states the final answer and ends the path
FINAL_ANSWER_MARKER = re.compile(r"the answer is|####|\\boxed|\\fbox", re.IGNORECASE)

#: value prompt: header and (question, steps so far, verdict) examples written for this project
VALUE_HEADER = "Is this partial solution on track? (sure/likely/impossible)\n"
VALUE_EXAMPLES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "A shop sells pencils at 3 for $1. How much do 12 pencils cost?",
        ("12 pencils are 12 / 3 = 4 groups of 3 pencils.",),
        "sure",
    ),
    (
        "Ann has 5 apples, buys 7 more and eats 2. How many apples does she have?",
        ("After buying she has 5 + 7 = 13 apples.",),
        "impossible",
    ),
    (
        "A train travels at 60 km per hour for 2.5 hours. How far does it go?",
        ("The train covers 60 km in each hour.",),
        "likely",
    ),
    (
        "Sam reads 15 pages a day. How many pages does he read in a week?",
        ("A week has 5 days, so he reads 15 * 5 = 75 pages.",),
        "impossible",
    ),
    (
        "A rectangle is 8 cm long and 5 cm wide. What is its area?",
        ("The area is 8 * 5 = 40 square cm.", "The answer is 40."),
        "sure",
    ),
)


#: the final answer line as each answer rule's instruction asks for it (Lark; llguidance's dialect)
ANSWER_LINES: dict[str, str] = {
    "number": r'"The answer is " /-?[0-9][0-9,]*(\.[0-9]+)?/ "." "\n"',
    "integer": r'"The answer is " /[0-9]{1,3}/ "." "\n"',
    "math": r'"The answer is $\\boxed{" braced "}$." "\n"',
}
#: a thought under ``answer_grammar``: any line that does not start "The answer is", or the answer
#: line of the task's rule (MATH: balanced braces inside \boxed{})
ANSWER_GRAMMAR = r"""start: answer | OTHER
answer: {line}
braced: (/[^{{}}\n$]+/ | "{{" braced "}}")*
OTHER: /[^\n]*\n/ & ~/(?s:The answer is.*)/
"""


def answer_line_grammar(rule: str) -> str:
    """The Lark grammar of one thought whose final answer line follows ``rule``'s format."""
    return ANSWER_GRAMMAR.format(line=ANSWER_LINES[rule])


class WorkedExample(NamedTuple):
    """One few-shot example: the question, its solution steps (the last gives the answer), the answer."""

    question: str
    steps: tuple[str, ...]
    answer: str


@dataclass(frozen=True, slots=True)
class StepwiseState:
    """Steps taken on one path (stripped thoughts) and the final answer once one was stated."""

    steps: tuple[str, ...] = ()
    answer: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain dict for logs."""
        return {"steps": list(self.steps), "answer": self.answer}


def format_example(question: str, steps: tuple[str, ...] = ()) -> str:
    """A question block: "Question: ...\\nSolution:\\n" then one line per step."""
    return f"Question: {question.strip()}\nSolution:\n" + "".join(f"{s}\n" for s in steps)


def value_query(question: str, steps: tuple[str, ...]) -> str:
    """One state's block of the value prompt; the model completes the verdict."""
    lines = "".join(f"{s}\n" for s in steps)
    return f"Question: {question.strip()}\nPartial solution:\n{lines}Judgement:"


class StepwiseValuePrompt(ValuePrompt):
    """Is a partial solution on track? Keyed by the question and the steps so far."""

    prefix = VALUE_HEADER + "".join(f"{value_query(q, s)} {v}\n\n" for q, s, v in VALUE_EXAMPLES)

    def examples_span(self) -> tuple[int, int]:
        """The verdict examples after the header line."""
        return len(VALUE_HEADER), len(self.prefix)

    def query(self, problem: Problem, state: StepwiseState) -> ValueQuery:
        """The question and the path's steps."""
        return ValueQuery(("stepwise", problem.question, state.steps), value_query(problem.question, state.steps))


class StepwiseTask(Task):
    """A math data set solved one step per thought (see the module docstring).

    Args:
        name: the task's name in results ("gsm8k").
        source: where the rows are: ``folder``, ``files`` (split -> file), ``hub`` (split -> dataset parts).
        question_field / answer_field: the row fields holding the question and the reference answer.
        meta_fields: row fields copied into ``Problem.meta`` (when present).
        answer: the answer rule, a key of :data:`~arbor_runtime.tasks.answers.ANSWER_RULES`.
        instruction: the first line of the prompt.
        examples: worked examples (mappings with ``question``, ``steps``, ``answer``).
        data_dir: a folder with the task's files; None loads the hub datasets of ``source``.
        split: which split of the source to read.
        start / end: the 0-based row slice (``end=None``: to the last row).
        step: "line" or "sentence" (what one thought is).
        max_steps / max_thought_tokens: thoughts per path and tokens per thought at most.
        cache_dir: the ``datasets`` cache for hub loads (None: its default).
        answer_grammar: sample every line under :func:`answer_line_grammar`: a line that states the
            answer ("The answer is ...") must give it in the rule's format (line steps only).
    """

    verifiers = ("answer_match", "llm_value")
    value_prompt = StepwiseValuePrompt()

    def __init__(
        self,
        name: str,
        source: Mapping[str, Any],
        answer: str,
        instruction: str,
        examples: Sequence[Mapping[str, Any]] = (),
        question_field: str = "question",
        answer_field: str = "answer",
        meta_fields: Sequence[str] = (),
        data_dir: str | None = None,
        split: str = "test",
        start: int = 0,
        end: int | None = None,
        step: str = "line",
        max_steps: int = 8,
        max_thought_tokens: int = 64,
        cache_dir: str | None = None,
        answer_grammar: bool = False,
    ) -> None:
        self.name = name
        if answer not in ANSWER_RULES:
            raise ValueError(f"{name}: task.answer={answer!r} is not one of {sorted(ANSWER_RULES)}")
        if step not in STEP_STOPS:
            raise ValueError(f"{name}: task.step={step!r} is not one of {sorted(STEP_STOPS)}")
        if max_steps < 1:
            raise ValueError(f"{name}: task.max_steps={max_steps} must be >= 1")
        if max_thought_tokens < 1:
            raise ValueError(f"{name}: task.max_thought_tokens={max_thought_tokens} must be >= 1")
        if not isinstance(answer_grammar, bool):
            raise ValueError(f"{name}: task.answer_grammar={answer_grammar!r} must be true or false")
        if answer_grammar and step != "line":
            raise ValueError(f"{name}: task.answer_grammar=true needs task.step=line (a thought is one line)")
        self.rule, self.instruction, self.split = ANSWER_RULES[answer], instruction, split
        self.grammar = answer_line_grammar(answer) if answer_grammar else None
        self.examples = tuple(WorkedExample(e["question"], tuple(e["steps"]), str(e["answer"])) for e in examples)
        self.step_kind, self.stop = step, STEP_STOPS[step]
        self.max_steps, self.max_thought_tokens = max_steps, max_thought_tokens
        self.fields = (question_field, answer_field, tuple(meta_fields))
        data = DataSource.from_config(source)
        rows, self.data_origin = load_rows(data, split, data_dir, (question_field, answer_field), cache_dir)
        self.start, self.end = check_slice(start, end, len(rows), name)
        self._problems = [self._problem(i, rows[i]) for i in range(self.start, self.end)]

    def problems(self) -> list[Problem]:
        """The problems of the configured slice, in file order."""
        return list(self._problems)

    def prompt(self, problem: Problem) -> str:
        """Instruction, worked examples, then "Question: ...\\nSolution:\\n"; blocks split by a blank line."""
        shots = [format_example(e.question, e.steps) for e in self.examples]
        return "\n".join([self.instruction + "\n", *shots, format_example(problem.question)])

    def examples_span(self, problem: Problem) -> tuple[int, int] | None:
        """The worked examples, between the instruction and the question (None without examples)."""
        if not self.examples:
            return None
        start = len(self.instruction + "\n") + 1
        shots = [format_example(e.question, e.steps) for e in self.examples]
        return start, start + len("\n".join(shots)) + 1

    def initial_state(self, problem: Problem) -> StepwiseState:
        """No steps, no answer."""
        return StepwiseState()

    def step(self, problem: Problem, state: StepwiseState, thought: str) -> StepResult:
        """Append the stripped thought; an answer marker or ``max_steps`` ends the path.

        An empty (whitespace-only) thought is invalid and keeps ``state``. Nothing is forced.
        """
        text = thought.strip()
        if not text:
            return StepResult(state=state, valid=False, reason="empty thought")
        steps = (*state.steps, text)
        if FINAL_ANSWER_MARKER.search(text):
            answer = self.rule.extract(text)
            return StepResult(state=StepwiseState(steps, answer), terminal=True, answer=answer)
        return StepResult(state=StepwiseState(steps), terminal=len(steps) >= self.max_steps)

    def propose(self, problem: Problem, state: StepwiseState) -> Proposal:
        """Free samples, or samples under the answer-line grammar when ``answer_grammar`` is on."""
        return Proposal(grammar=self.grammar)

    def is_correct(self, problem: Problem, answer: str | None) -> bool:
        """Whether the stated answer matches the reference answer under the task's answer rule."""
        if answer is None or problem.answer is None:
            return False
        return self.rule.match(answer, problem.answer)

    def answers_match(self, pred: str, gold: str) -> bool:
        """Equality under the task's answer rule (numbers within 1e-6, MATH equivalence, integers)."""
        return self.rule.match(pred, gold)

    def state_key(self, state: StepwiseState) -> tuple[str, ...]:
        """The steps so far, each with its whitespace collapsed and case folded."""
        return tuple(" ".join(step.split()).casefold() for step in state.steps)

    def _problem(self, index: int, row: dict[str, Any]) -> Problem:
        question, answer, meta = self.fields
        info = {key: row[key] for key in meta if key in row} | {"split": self.split}
        return Problem(index, str(row[question]), self.rule.gold(str(row[answer])), info)
