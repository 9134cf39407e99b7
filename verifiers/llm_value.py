"""LLM value verifier in the Tree-of-Thoughts style (Yao et al. 2023, game24 ``value_prompt``).

The model is asked whether a state can still succeed: "sure", "likely" or "impossible". It samples
``n_evaluate`` short verdicts; as in ToT the raw value is the sum of 20 / 1 / 0.001 per verdict
(unreadable samples add 0). Our controllers expect scores in [0, 1], so the score is
``raw / (20 * n_evaluate)``: all "sure" gives 1.0, and the order of states is ToT's.

The few-shot value prefix is its own tree root in the search's runtime, prefilled once: each
state is a teacher-forced block appended to that root, sampled from, and released again, so only
the prefix stays resident. Values are cached per state (ToT's value cache) for one runtime.
Unlike ToT's prompt, the examples give the verdict directly (no arithmetic lines first), so a
verdict fits in a few tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from arbor_runtime import Node, Runtime, SamplingParams
from tasks.base import Problem, StepResult
from tasks.stepwise import StepwiseState
from verifiers.base import Verifier
from verifiers.game24 import check_expression

#: ToT's value_map: value of one sampled verdict
VALUE_MAP: dict[str, float] = {"sure": 20.0, "likely": 1.0, "impossible": 0.001}
#: the best one verdict can add; the normalizer is this times ``n_evaluate``
MAX_VERDICT_VALUE = max(VALUE_MAP.values())

_WORD = re.compile(r"[a-z]+")

GAME24_HEADER = "Evaluate if given numbers can reach 24 (sure/likely/impossible)\n"
#: written for this project: (numbers left, verdict); "likely" = in range, no quick way to 24
GAME24_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("3 5", "impossible"),
    ("6 4", "sure"),
    ("4 5 7", "likely"),
    ("13 13 13", "impossible"),
    ("2 10 12", "sure"),
    ("1 1 2", "impossible"),
    ("3 9 10", "likely"),
    ("7 8 10", "sure"),
)

STEPWISE_HEADER = "Is this partial solution on track? (sure/likely/impossible)\n"
#: written for this project: (question, steps so far, verdict)
STEPWISE_EXAMPLES: tuple[tuple[str, tuple[str, ...], str], ...] = (
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


def parse_verdict(text: str) -> str | None:
    """The verdict a sampled completion gives: its last word among sure/likely/impossible, else None."""
    words = [w for w in _WORD.findall(text.lower()) if w in VALUE_MAP]
    return words[-1] if words else None


def raw_value(verdicts: list[str | None]) -> float:
    """ToT's value of sampled verdicts: 20 per "sure", 1 per "likely", 0.001 per "impossible"."""
    return sum((VALUE_MAP.get(v, 0.0) for v in verdicts if v is not None), 0.0)


def game24_query(numbers: str) -> str:
    """The per-state block of the Game of 24 value prompt; the model completes the verdict."""
    return f"Input: {numbers}\nJudgement:"


def stepwise_query(question: str, steps: tuple[str, ...]) -> str:
    """The per-state block of the stepwise value prompt; the model completes the verdict."""
    lines = "".join(f"{s}\n" for s in steps)
    return f"Question: {question.strip()}\nPartial solution:\n{lines}Judgement:"


def _prefix(header: str, shots: list[str], separator: str) -> str:
    return header + "".join(f"{shot}{separator}" for shot in shots)


#: few-shot value prefixes (the verifier's own tree roots), rendered like the queries they precede
GAME24_PREFIX = _prefix(GAME24_HEADER, [f"{game24_query(n)} {v}\n" for n, v in GAME24_EXAMPLES], "")
STEPWISE_PREFIX = _prefix(STEPWISE_HEADER, [f"{stepwise_query(q, s)} {v}\n" for q, s, v in STEPWISE_EXAMPLES], "\n")


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The sampled verdicts for one state and their ToT value (``raw``) and score in [0, 1]."""

    verdicts: tuple[str | None, ...]
    raw: float
    score: float


class ValueQuery(NamedTuple):
    """Which prefix a state uses, its cache key, and the text appended to that prefix."""

    prefix: str
    key: tuple
    text: str


class LLMValueVerifier(Verifier):
    """ToT value prompting over the search's own runtime (bound by the controller).

    Args:
        n_evaluate: verdicts sampled per state (one batch).
        temperature: sampling temperature of the verdicts.
        max_new_tokens: tokens one verdict may take (it ends at a newline).
        runtime: the runtime to evaluate in; controllers call :meth:`bind`, so leave it None there.

    Scores: 0.0 for an invalid thought (no model call); a finished Game of 24 path 1.0 / 0.0 by the
    exact checker; a finished stepwise path without an answer 0.0; otherwise the normalized value.
    """

    name = "llm_value"

    def __init__(
        self, n_evaluate: int = 3, temperature: float = 0.7, max_new_tokens: int = 8, runtime: Runtime | None = None
    ) -> None:
        if n_evaluate < 1:
            raise ValueError(f"llm_value: n_evaluate={n_evaluate} must be >= 1")
        self.n_evaluate = n_evaluate
        self.sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, stop=["\n"])
        self.runtime: Runtime | None = None
        self.roots: dict[str, Node] = {}  # prefix text -> its root in ``runtime``
        self.cache: dict[tuple, Evaluation] = {}
        self.evaluations = 0  # states sent to the model (cache misses)
        if runtime is not None:
            self.bind(runtime)

    def bind(self, runtime: Runtime) -> None:
        """Evaluate in ``runtime`` from now on; a new runtime starts with no prefix root and an empty cache."""
        if runtime is not self.runtime:
            self.runtime, self.roots, self.cache = runtime, {}, {}

    def score(self, problem: Problem, result: StepResult) -> float:
        """Value of the state after a thought, in [0, 1] (see the class docstring)."""
        if not result.valid:
            return 0.0
        final = _final_score(result)
        if final is not None:
            return final
        return self.evaluate(value_query(problem, result.state)).score

    def describe(self, problem: Problem, result: StepResult) -> dict[str, Any]:
        """The raw ToT value and the verdicts of a state already scored (no model call; {} otherwise)."""
        if not result.valid or _final_score(result) is not None:
            return {}
        ev = self.cache.get(value_query(problem, result.state).key)
        return {} if ev is None else {"value_raw": ev.raw, "verdicts": list(ev.verdicts)}

    def evaluate(self, query: ValueQuery) -> Evaluation:
        """Sample ``n_evaluate`` verdicts for ``query`` below its prefix root (cached per state)."""
        if query.key in self.cache:
            return self.cache[query.key]
        rt = self._bound()
        block = rt.append(self._root(query.prefix), query.text)
        try:
            samples = rt.expand(block, n=self.n_evaluate, sampling=self.sampling)
            verdicts = tuple(parse_verdict(s.text) for s in samples)
        finally:
            rt.release(block)  # drops the query and its samples; the prefix stays
        raw = raw_value(list(verdicts))
        ev = Evaluation(verdicts, raw, raw / (MAX_VERDICT_VALUE * self.n_evaluate))
        self.cache[query.key] = ev
        self.evaluations += 1
        return ev

    # ---- helpers -------------------------------------------------------------------------
    def _bound(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("LLMValueVerifier has no runtime: call bind(runtime) first (controllers do)")
        return self.runtime

    def _root(self, prefix: str) -> Node:
        """The prefix's root block, prefilled on first use (and again only if it was released)."""
        root = self.roots.get(prefix)
        if root is None or root.released:
            root = self._bound().new_tree(prefix)
            root.meta["role"] = "value_prefix"
            self.roots[prefix] = root
        return root


def _final_score(result: StepResult) -> float | None:
    """Score of a finished path that needs no model: Game of 24 checked exactly, no stated answer 0."""
    state = result.state
    if not result.terminal:
        return None
    if _is_game24(state):
        expr = state.final_expression
        return 1.0 if expr is not None and check_expression(expr, state.inputs) else 0.0
    if isinstance(state, StepwiseState) and state.answer is None:
        return 0.0
    return None


def value_query(problem: Problem, state: Any) -> ValueQuery:
    """The value query of ``state``: numbers left (Game of 24) or question and steps (stepwise)."""
    if _is_game24(state):
        numbers = " ".join(state.to_json()["left"])
        return ValueQuery(GAME24_PREFIX, ("game24", numbers), game24_query(numbers))
    if isinstance(state, StepwiseState):
        return ValueQuery(
            STEPWISE_PREFIX, ("stepwise", problem.question, state.steps), stepwise_query(problem.question, state.steps)
        )
    raise TypeError(
        f"llm_value: no value prompt for state {type(state).__name__}; expected Game24State or StepwiseState"
    )


def _is_game24(state: Any) -> bool:
    # imported here: tasks.game24 imports the verifiers package, which imports this module (a cycle)
    from tasks.game24 import Game24State

    return isinstance(state, Game24State)
