"""LLM value verifier in the Tree-of-Thoughts style (Yao et al. 2023, game24 ``value_prompt``).

The model is asked whether a state can still succeed: "sure", "likely" or "impossible".

- ``mode="choose"`` (default): the state's query followed by each verdict is scored as a choice
  under the prefix (``Runtime.choose``: one forward of three short rows that read the prefix once,
  nothing stored). The query's own tokens are the same in every row, so the choice distribution is
  exactly the verdicts' probabilities p given the query, renormalized over the three; no sampling.
  The raw value is ToT's expectation ``sum_v p_v * {20, 1, 0.001}_v``, the score ``raw / 20``.
- ``mode="sample"``: ToT's own estimate. It samples ``n_evaluate`` short verdicts; the raw value is
  the sum of 20 / 1 / 0.001 per verdict (unreadable samples add 0) and the score
  ``raw / (20 * n_evaluate)``: all "sure" gives 1.0, and the order of states is ToT's.

The prompt is the task's own (:attr:`arbor_runtime.tasks.base.Task.value_prompt`): its few-shot prefix is a tree
root in the search's runtime, prefilled once; each state's query is a teacher-forced block appended
to that root, sampled from, and released again, so only the prefix stays resident. Values are
cached per state (ToT's value cache) for one runtime. Unlike ToT's prompt, the examples give the
verdict directly (no arithmetic lines first), so a verdict fits in a few tokens.

``lookahead=k`` (choose mode, a prompt with a trial form: Game of 24) is ToT's own order: the examples
show up to k trials before their verdict, the model writes up to k trial lines after a state's query
(greedy, :data:`TRIAL_TOKENS` tokens a line at most, in a block released afterwards), and the verdicts
are scored after the query, its trials and the prompt's verdict cue. Deeper lookahead spends more
model time per state on a better-informed verdict (issue 50's third widening). ``trial_values="exact"``
keeps only trials the task can check (Game of 24: an expression of exactly the numbers left) and writes
their exact values in place of the model's own arithmetic, as ``task.propose=legal`` does for steps.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from typing import Any

from arbor_runtime import Node, Runtime, SamplingParams
from arbor_runtime.tasks.base import Problem, StepResult, Task, ValuePrompt, ValueQuery
from arbor_runtime.verifiers.base import Scale, Verifier, charge_model_call

#: ToT's value_map: value of one sampled verdict
VALUE_MAP: dict[str, float] = {"sure": 20.0, "likely": 1.0, "impossible": 0.001}
#: the best one verdict can add; the normalizer is this times ``n_evaluate``
MAX_VERDICT_VALUE = max(VALUE_MAP.values())
#: the scores' meaning: "live" is a mean verdict of at least "likely" (1 / 20 after normalizing);
#: every verdict "sure" (1.0) is taken as a verified solution (on finished Game of 24 paths the
#: value prompt's exact check gives 1.0 or 0.0 instead)
LLM_VALUE_SCALE = Scale(
    live=VALUE_MAP["likely"] / MAX_VERDICT_VALUE,
    solution=1.0,
    meaning="mean verdict: 1.0 all sure; 0.05 likely; 0.00005 impossible; 0.0 invalid or unreadable",
)

_WORD = re.compile(r"[a-z]+")


def parse_verdict(text: str) -> str | None:
    """The verdict a sampled completion gives: its last word among sure/likely/impossible, else None."""
    words = [w for w in _WORD.findall(text.lower()) if w in VALUE_MAP]
    return words[-1] if words else None


def raw_value(verdicts: list[str | None]) -> float:
    """ToT's value of sampled verdicts: 20 per "sure", 1 per "likely", 0.001 per "impossible"."""
    return sum((VALUE_MAP.get(v, 0.0) for v in verdicts if v is not None), 0.0)


#: the modes of the verifier: verdicts scored as choices, or sampled
MODES = ("choose", "sample")
#: the verdicts as choices after "Judgement:" (the value prompts' examples write " sure" etc.)
VERDICT_CHOICES = tuple(f" {v}" for v in VALUE_MAP)
#: tokens one trial line may take (lookahead)
TRIAL_TOKENS = 24
#: whose values the kept trials carry: the model's own, or the task's exact ones
TRIAL_VALUES = ("model", "exact")


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One state's verdicts (sampled; or None in choose mode), their probabilities (choose mode; else
    empty), the ToT value (``raw``), the score in [0, 1] and the trial lines the model wrote first
    (lookahead; else None)."""

    verdicts: tuple[str | None, ...]
    raw: float
    score: float
    probs: dict[str, float] | None = None
    trials: str | None = None


class LLMValueVerifier(Verifier):
    """ToT value prompting over the search's own runtime, with the task's value prompt.

    Args:
        mode: "choose" (verdict probabilities) or "sample" (``n_evaluate`` sampled verdicts).
        n_evaluate: verdicts sampled per state (one batch; sample mode).
        temperature: sampling temperature of the verdicts.
        max_new_tokens: tokens one verdict may take (it ends at a newline).
        lookahead: trial lines the model writes before its verdict (choose mode; the task's value
            prompt must have a trial form: Game of 24 takes 0-3); 0: verdict first.
        trial_values: "model" (the trials as the model wrote them, ToT's way) or "exact" (only trials the
            task can check, with their exact values); no effect without lookahead.
        runtime / prompt: what to evaluate in and with; a controller binds both (the task's
            ``value_prompt``), so leave them None there.

    Scores: 0.0 for an invalid thought (no model call); a finished path by the prompt's
    ``finished_score`` when it knows one (Game of 24: the exact check; no stated answer: 0.0);
    otherwise the normalized value.
    """

    name = "llm_value"
    scale = LLM_VALUE_SCALE
    max_calls_per_score = 1  # one batch of n_evaluate verdicts per state

    def __init__(
        self,
        n_evaluate: int = 3,
        temperature: float = 0.7,
        max_new_tokens: int = 8,
        runtime: Runtime | None = None,
        prompt: ValuePrompt | None = None,
        seed: int = 0,
        mode: str = "choose",
        lookahead: int = 0,
        trial_values: str = "model",
    ) -> None:
        if n_evaluate < 1:
            raise ValueError(f"llm_value: n_evaluate={n_evaluate} must be >= 1")
        if mode not in MODES:
            raise ValueError(f"llm_value: mode={mode!r} must be one of {', '.join(MODES)}")
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
            raise ValueError(f"verifier.lookahead={lookahead!r}: valid: an integer >= 0 (0: verdict first)")
        if trial_values not in TRIAL_VALUES:
            raise ValueError(f"verifier.trial_values={trial_values!r}: valid: {', '.join(TRIAL_VALUES)}")
        if lookahead and mode != "choose":
            raise ValueError(f"verifier.lookahead={lookahead} needs verifier.mode=choose (got {mode})")
        self.n_evaluate, self.mode, self.lookahead, self.trial_values = n_evaluate, mode, lookahead, trial_values
        self.sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, stop=["\n"])
        self.runtime: Runtime | None = None
        self.prompt = None if prompt is None else prompt.with_lookahead(lookahead)
        self.roots: dict[str, Node] = {}  # prefix text -> its root in ``runtime``
        self.cache: dict[Any, Evaluation] = {}
        self.evaluations = 0  # states sent to the model (cache misses)
        #: seed of the prefix tree's sampling: the same for every problem, so a state's verdicts are a
        #: function of its text whichever search (or how many at once) asks
        self.seed = seed
        self._lock = threading.Lock()  # searches in threads share one verifier
        if runtime is not None:
            self.use_runtime(runtime)

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process gets (Ray ships the verifier to its actors): the settings and
        the prompt. The runtime, its prefix roots, the value cache and its miss count belong to this
        process (a copy is bound to its own runtime), and a lock cannot be pickled: :meth:`__setstate__`
        makes a new one."""
        state = {k: v for k, v in self.__dict__.items() if k != "_lock"}
        return state | {"runtime": None, "roots": {}, "cache": {}, "evaluations": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def bind(self, runtime: Runtime, task: Task) -> None:
        """Evaluate in ``runtime`` with ``task``'s value prompt (ValueError if it has none)."""
        self.prompt = self.task_prompt(task)
        self.use_runtime(runtime)

    def check_task(self, task: Task) -> None:
        """Refuse (ValueError) a task without a value prompt, or one whose prompt has no trial form
        when ``lookahead`` asks for trials: before any model loads."""
        self.task_prompt(task)

    def task_prompt(self, task: Task) -> ValuePrompt:
        """``task``'s value prompt with this verifier's lookahead."""
        if task.value_prompt is None:
            valid = ", ".join(task.verifiers)
            raise ValueError(f"verifier=llm_value: task {task.name} has no value prompt; valid verifiers: {valid}")
        return task.value_prompt.with_lookahead(self.lookahead)

    def use_runtime(self, runtime: Runtime) -> None:
        """Evaluate in ``runtime`` from now on; a new runtime starts with no prefix root and an empty cache."""
        if runtime is not self.runtime:
            self.runtime, self.roots, self.cache = runtime, {}, {}

    def score(self, problem: Problem, result: StepResult) -> float:
        """Value of the state after a thought, in [0, 1] (see the class docstring)."""
        if not result.valid:
            return 0.0
        finished = self._finished(problem, result)
        if finished is not None:
            return finished
        return self.evaluate(self._prompt().query(problem, result.state)).score

    def describe(self, problem: Problem, result: StepResult) -> dict[str, Any]:
        """The raw ToT value, the verdicts (or their probabilities) and, with lookahead, the trial lines the model
        wrote, of a state already scored (no model call; {} otherwise)."""
        if not result.valid or self._finished(problem, result) is not None:
            return {}
        ev = self.cache.get(self._prompt().query(problem, result.state).key)
        if ev is None:
            return {}
        found = {"value_raw": ev.raw} | ({"verdict_probs": ev.probs} if ev.probs else {"verdicts": list(ev.verdicts)})
        return found | ({"trials": ev.trials} if ev.trials is not None else {})

    def evaluate(self, query: ValueQuery) -> Evaluation:
        """Score ``query`` below the prefix root: verdict probabilities or samples (cached per state).

        The asking search is charged one model call per state (:func:`~arbor_runtime.verifiers.base.charge_model_call`).
        """
        charge_model_call(query.key)
        if query.key in self.cache:
            return self.cache[query.key]
        rt = self._bound()
        root = self._root(self._prompt().prefix)
        if self.mode == "choose" and self._prompt().lookahead:
            trials = self._trials(rt, root, query)
            ev = replace(self._choose(rt, root, query.text + trials + self._prompt().verdict_cue), trials=trials)
        elif self.mode == "choose":
            ev = self._choose(rt, root, query.text)
        else:
            block = rt.append(root, query.text)
            try:
                ev = self._sample(rt, block)
            finally:
                rt.release(block)  # drops the query and its samples; the prefix stays
        self.cache[query.key] = ev
        self.evaluations += 1
        return ev

    # ---- helpers -------------------------------------------------------------------------
    def _trials(self, rt: Runtime, root: Node, query: ValueQuery) -> str:
        """The trial lines the model writes (greedy) after ``query`` below the prefix, as the prompt keeps
        them; the block they were written in is released."""
        prompt = self._prompt()
        sampling = SamplingParams(
            max_new_tokens=prompt.lookahead * TRIAL_TOKENS, temperature=0.0, stop=[prompt.verdict_cue, "\nInput:"]
        )
        block = rt.append(root, query.text)
        try:
            (written,) = rt.expand(block, n=1, sampling=sampling)
            return prompt.trials(written.text, query, exact=self.trial_values == "exact")
        finally:
            rt.release(block)

    def _choose(self, rt: Runtime, root: Node, query: str) -> Evaluation:
        """The verdicts' probabilities after the query (renormalized over the three) and their expected value."""
        scored = rt.choose(root, [query + v for v in VERDICT_CHOICES])
        probs = dict(zip(VALUE_MAP, scored.probs_sum, strict=True))
        raw = sum(p * VALUE_MAP[v] for v, p in probs.items())
        return Evaluation((), raw, raw / MAX_VERDICT_VALUE, probs)

    def _sample(self, rt: Runtime, block: Node) -> Evaluation:
        """``n_evaluate`` sampled verdicts and ToT's sum of their values."""
        samples = rt.expand(block, n=self.n_evaluate, sampling=self.sampling)
        verdicts = tuple(parse_verdict(s.text) for s in samples)
        raw = raw_value(list(verdicts))
        return Evaluation(verdicts, raw, raw / (MAX_VERDICT_VALUE * self.n_evaluate))

    def _finished(self, problem: Problem, result: StepResult) -> float | None:
        return self._prompt().finished_score(problem, result) if result.terminal else None

    def _prompt(self) -> ValuePrompt:
        if self.prompt is None:
            raise RuntimeError("LLMValueVerifier has no value prompt: bind(runtime, task) first (controllers do)")
        return self.prompt

    def _bound(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("LLMValueVerifier has no runtime: bind(runtime, task) first (controllers do)")
        return self.runtime

    def _root(self, prefix: str) -> Node:
        """The prefix's root block, prefilled on first use (and again only if it was released)."""
        with self._lock:
            root = self.roots.get(prefix)
            if root is None or root.released:
                root = self._bound().new_tree(prefix, seed=self.seed, examples=self._prompt().examples_span())
                root.meta["role"] = "value_prefix"
                self.roots[prefix] = root
            return root
