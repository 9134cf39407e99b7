"""Controller base: the search loop's vocabulary over the public Runtime API.

A controller grows a tree for one problem: ``select`` nodes to grow, ``expand`` them (the
runtime samples thoughts, the task interprets them, duplicates of states already seen are
dropped, the verifier scores the rest), ``settle`` (release every branch that holds nothing the
search may still grow or return), stop at a verified solution, and report a ``result``.
Controllers never touch tensors; they only choose which node to expand next, which is all the
memory manager needs to see branch switches.

Faithfulness rules every built-in controller follows (docs/controllers.md):

- a candidate whose state (``Task.state_key``) was already seen in this search is dropped before
  ranking and released at once (``duplicates_dropped``);
- after each selection, every node with no descendant in the frontier or on the best path is
  released (``settle``), a replaced best answer too;
- a search stops early only on a finished path the verifier certifies (``Scale.solution``) or,
  with a verifier that does not check correctness, on a self-consistency vote (``vote_quorum``);
- every model call (thoughts sampled by the controller, states the verifier asks the model
  about) counts against ``max_model_calls`` and is reported.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from arbor_runtime import Node, Runtime, SamplingParams
from arbor_runtime.tasks.answers import majority_vote
from arbor_runtime.tasks.base import Problem, Proposal, StepResult, Task
from arbor_runtime.validation import MAX_ROWS
from arbor_runtime.verifiers.base import Verifier, charging


@dataclass(slots=True)
class SearchResult:
    """What one search produced.

    Attributes:
        solved: the best terminal state is correct (checked by the task against the problem).
        answer: the best terminal's final answer (None when no terminal was reached).
        best: the node ending the best path (None when nothing valid was produced).
        expansions: ids of expanded nodes, in expansion order.
        off_path_expansions: expansions whose node does not extend the previously expanded node's
            path (the search jumped elsewhere in the tree; a runtime-level count of policy events is
            ``RuntimeMetrics.branch_switch_events``).
        steps: search iterations (BFS levels, DFS visits, MCTS iterations, ...).
        seconds: wall time of the search.
        extra: controller-specific fields (dfs: ``backtracks``, ``visits``; mcts: ``visits``,
            ``ends``, ``values``, ``tree``, ``rollouts``; beam: ``finished``), plus the
            self-consistency vote over every valid terminal with an answer, when there is one:
            ``vote_answer``, ``vote_count``, ``vote_correct``.
        duplicates_dropped: candidates dropped because their state was already seen.
        generation_calls: thought generations the controller asked for (one per expanded node,
            rollout steps included).
        verifier_calls: states the verifier asked the model about (each counted once).
    """

    solved: bool
    answer: str | None
    best: Node | None
    expansions: list[int]
    off_path_expansions: int
    steps: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    duplicates_dropped: int = 0
    generation_calls: int = 0
    verifier_calls: int = 0

    @property
    def model_calls(self) -> int:
        """Every model call of the search: generations and verifier calls."""
        return self.generation_calls + self.verifier_calls


@dataclass(eq=False, slots=True)
class Candidate:
    """A scored thought: the node ending it (the forced block when the task wrote one) and its step."""

    node: Node
    thought: Node
    result: StepResult
    score: float

    @property
    def key(self) -> tuple[float, float]:
        """Sort key: verifier score, then the thought's mean log-probability."""
        return (self.score, self.thought.mean_logprob)


def is_number(value: Any) -> bool:
    """A real number (int or float), not a bool or a string."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any, least: int, valid: str = "", most: int | None = None) -> None:
    """Refuse ``value`` unless it is an integer >= ``least`` (and <= ``most``) (ValueError naming it)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name}={value!r} must be an integer >= {least}{valid}")
    if most is not None and value > most:
        raise ValueError(f"{name}={value!r} must be an integer from {least} to {most}{valid}")


def check_thoughts(name: str, value: Any, valid: str) -> None:
    """A count of thoughts asked of one node at once: 1 to ``MAX_ROWS`` (what one expansion may hold)."""
    check_int(name, value, 1, valid, most=MAX_ROWS)


class Controller(ABC):
    """Base class of search algorithms.

    Args:
        runtime: the runtime to grow trees in.
        task: interprets thoughts, defines state identity (``state_key``) and checks answers.
        verifier: scores nodes on its declared ``scale``; bound here to ``runtime`` and ``task``
            (an LLM value verifier evaluates in the runtime with the task's value prompt).
        temperature / top_p: sampling of thoughts (stop strings and length come from the task).
        release_pruned: release what the search will not come back to at once (frees its KV);
            False keeps every node for tree-aware memory policies and tree output.
        max_model_calls: cap on model calls (generations plus verifier calls); a step that could
            pass it is cut to what fits or not taken. None: no cap.
        vote_quorum: with a verifier that does not check correctness, the search stops once this
            many finished paths state the same answer (0: never stop early).
    """

    name = "controller"

    def __init__(
        self,
        runtime: Runtime,
        task: Task,
        verifier: Verifier,
        temperature: float = 0.7,
        top_p: float = 1.0,
        release_pruned: bool = True,
        max_model_calls: int | None = None,
        vote_quorum: int = 3,
    ) -> None:
        Controller.check_params(
            temperature=temperature, top_p=top_p, max_model_calls=max_model_calls, vote_quorum=vote_quorum
        )
        self.rt, self.task, self.verifier = runtime, task, verifier
        verifier.bind(runtime, task)
        self.sampling = SamplingParams(
            max_new_tokens=task.max_thought_tokens, temperature=temperature, top_p=top_p, stop=list(task.stop)
        )
        self.release_pruned, self.max_model_calls, self.vote_quorum = release_pruned, max_model_calls, vote_quorum
        self.problem: Problem | None = None
        self.root: Node | None = None  # the tree of the last search
        self._reset_search()

    @classmethod
    def check_params(
        cls,
        temperature: float = 0.7,
        top_p: float = 1.0,
        release_pruned: bool = True,
        max_model_calls: int | None = None,
        vote_quorum: int = 3,
        **own: Any,
    ) -> None:
        """Refuse bad settings with a ValueError naming the value and what is valid; no runtime needed,
        so ``arbor-solve`` checks a config before the model loads. ``own``: the subclass's settings
        (:meth:`check_own`)."""
        if not is_number(temperature) or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
        if not is_number(top_p) or not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p={top_p!r} must be a number in (0, 1] (1: the whole distribution)")
        if not isinstance(release_pruned, bool):
            raise ValueError(f"release_pruned={release_pruned!r} must be true or false")
        if max_model_calls is not None:
            check_int("max_model_calls", max_model_calls, 1, " or None (no cap)")
        check_int("vote_quorum", vote_quorum, 0, " (0: never stop on a vote)")
        cls.check_own(**own)

    @classmethod
    def check_own(cls) -> None:
        """Refuse bad values of the subclass's own settings (keyword arguments with its defaults)."""
        return None  # the base has none

    def _reset_search(self) -> None:
        """Per-search state (a controller instance runs one search at a time)."""
        self.expansions: list[int] = []
        self.off_path_expansions = 0
        self.best: Candidate | None = None  # the best finished path so far
        self.terminals: list[Candidate] = []  # every valid terminal scored this search (for the vote)
        self.duplicates_dropped = 0
        self.generation_calls = 0
        self.verifier_keys: set[Hashable] = set()  # states the verifier asked the model about
        self._seen: set[Hashable] = set()  # state keys of the candidates kept so far
        self._vote_groups: list[tuple[str, int]] = []  # (first answer, count) as majority_vote groups them

    # ---- the loop ------------------------------------------------------------------------
    def solve(self, problem: Problem, seed: int | None = None) -> SearchResult:
        """Run the search on one problem; ``seed`` seeds its tree's sampling (default: the runtime's)."""
        start = time.perf_counter()
        self._reset_search()
        self.problem = problem
        root = self.rt.new_tree(self.task.prompt(problem), seed=seed, examples=self.task.examples_span(problem))
        self.root = root
        root.meta["state"] = self.task.initial_state(problem)
        self._first_visit(root.meta["state"])
        steps, best = self.search(root)
        self.settle([best])  # the search is over: only its answer's path (and its frontier) stay
        return self.result(best, steps, time.perf_counter() - start)

    @abstractmethod
    def search(self, root: Node) -> tuple[int, Candidate | None]:
        """Grow the tree from ``root``; return (steps taken, best terminal candidate or None)."""

    # ---- vocabulary shared by controllers ------------------------------------------------
    def root_candidate(self, root: Node) -> Candidate:
        """The root as a candidate (valid, not terminal, score 0), so searches handle it like any node."""
        return Candidate(node=root, thought=root, result=StepResult(state=root.meta["state"]), score=0.0)

    def expand(
        self, requests: list[tuple[Node, int]], sampling: SamplingParams | None = None, dedup: bool = True
    ) -> list[list[Candidate]]:
        """Thoughts for (node, n) requests as the task proposes them (``_propose``), interpreted and scored.

        ``sampling`` overrides the controller's own parameters for this call (e.g. greedy rollouts).
        With ``dedup`` (the default), a valid thought whose state was already seen in this search is
        dropped (released, counted in ``duplicates_dropped``) before it is scored, so a group may
        hold fewer than ``n`` candidates; lookahead that is not a candidate (rollouts, peeks)
        passes ``dedup=False``. Each request is one model call (``generation_calls``).
        """
        for node, _ in requests:
            self._record_expansion(node)
        self.generation_calls += len(requests)
        groups = self._propose(requests, sampling or self.sampling)
        out = []
        for (parent, _), kids in zip(requests, groups, strict=True):
            results = [(kid, self.task.step(self.problem, parent.meta["state"], kid.text)) for kid in kids]
            fresh = [(kid, r) for kid, r in results if not (dedup and r.valid and self._duplicate(kid, r))]
            out.append([self.evaluate(parent, kid, r) for kid, r in fresh])
        return out

    def _propose(self, requests: list[tuple[Node, int]], sampling: SamplingParams) -> list[list[Node]]:
        """Children per request as the task proposes them (``Task.propose``): the model's best ``n`` of
        the task's choices (``Runtime.choose``), or ``n`` samples (under the task's regex, if any)."""
        plans = [self.task.propose(self.problem, node.meta["state"]) for node, _ in requests]
        out: list[list[Node]] = [[] for _ in requests]
        for i, ((node, n), plan) in enumerate(zip(requests, plans, strict=True)):
            if plan.choices:
                out[i] = self.rt.choose(node, list(plan.choices), keep=min(n, len(plan.choices))).kept
        free = [i for i, plan in enumerate(plans) if not plan.choices]
        for part in _calls(free, [requests[i][1] for i in free]):  # at most MAX_ROWS rows a call
            params = [_constrained(sampling, plans[i]) for i in part]
            kids = self.rt.expand_many([requests[i] for i in part], params)
            for i, group in zip(part, kids, strict=True):
                out[i] = group
        return out

    def evaluate(self, parent: Node, thought: Node, result: StepResult | None = None) -> Candidate:
        """Append the forced text of ``thought``'s step and score it (``result``: the task's reading of
        ``thought`` when the caller has it; else the task interprets it here)."""
        if result is None:
            result = self.task.step(self.problem, parent.meta["state"], thought.text)
        node = thought
        if result.valid and result.forced_text:
            node = self.rt.append(thought, result.forced_text)
        with charging(self.verifier_keys):
            score = self.verifier.score_node(self.problem, result, node) if result.valid else self.verifier.scale.low
        node.meta.update(state=result.state, terminal=result.terminal, valid=result.valid, reason=result.reason)
        thought.meta.setdefault("valid", result.valid)
        self.rt.set_value(node, score)
        cand = Candidate(node=node, thought=thought, result=result, score=score)
        if result.valid and self.is_terminal(cand):
            self.terminals.append(cand)
            self._count_vote(result.answer)
        return cand

    def is_terminal(self, cand: Candidate) -> bool:
        """The path is finished: the task says so (an answer, or its step limit), or it is that deep."""
        return cand.result.terminal or cand.node.depth >= 2 * self.task.max_steps

    @staticmethod
    def rank(cands: list[Candidate]) -> list[Candidate]:
        """``cands`` best first by :attr:`Candidate.key`; ties keep their order (stable sort)."""
        return sorted(cands, key=lambda c: c.key, reverse=True)

    def best_terminal(self, best: Candidate | None, cands: list[Candidate]) -> Candidate | None:
        """The better of ``best`` and the valid terminal ``cands`` by key (``best`` wins ties)."""
        for cand in cands:
            if cand.result.valid and self.is_terminal(cand) and (best is None or cand.key > best.key):
                best = cand
        return best

    def offer(self, cands: list[Candidate]) -> None:
        """Make the best valid terminal of ``cands`` the search's :attr:`best` if it beats it (the
        replaced one goes at the next :meth:`settle`)."""
        self.best = self.best_terminal(self.best, cands)

    def is_solution(self, cand: Candidate | None) -> bool:
        """Whether the search may stop, ``cand`` being its best finished path.

        With a verifier that checks correctness (``scale.solution`` set): ``cand`` scores at least
        that. Otherwise (an answer-presence score proves nothing) only self-consistency can stop
        it: ``vote_quorum`` finished paths of this search state the same answer.
        """
        if cand is None or not cand.result.valid or not self.is_terminal(cand):
            return False
        solution = self.verifier.scale.solution
        if solution is not None:
            return cand.score >= solution
        return 0 < self.vote_quorum <= max((count for _, count in self._vote_groups), default=0)

    def frontier(self) -> list[Candidate]:
        """The candidates the search may still expand or come back to (built-in controllers keep
        theirs; the default is none). :meth:`settle` keeps them and the best path."""
        return []

    def settle(self, keep: Iterable[Candidate | None] = ()) -> None:
        """Release every branch that holds no node of :meth:`frontier`, of ``keep``, nor the best
        path: what the search can never use again (a replaced best answer too). The root stays.

        Call it after each selection. Nothing is released with ``release_pruned=False``.
        """
        if not self.release_pruned or self.root is None:
            return
        kept = {n.id for c in [*self.frontier(), *keep, self.best] if c is not None for n in c.node.path()}
        stack = [self.root]
        while stack:
            node = stack.pop()
            for child in list(node.children):
                if child.id in kept:
                    stack.append(child)
                elif not child.released:
                    self.rt.release(child)

    def prune(self, cands: list[Candidate]) -> None:
        """Drop candidates the search will not return to (releases their KV when configured)."""
        if self.release_pruned:
            for cand in cands:
                if not cand.thought.released:
                    self.rt.release(cand.thought)

    # ---- model calls -----------------------------------------------------------------------
    @property
    def model_calls(self) -> int:
        """Model calls so far in this search: generations plus states the verifier asked about."""
        return self.generation_calls + len(self.verifier_keys)

    def counts(self) -> dict[str, int]:
        """This search's counts for a results row (so far, when it was cut short by an error)."""
        return {
            "off_path_expansions": self.off_path_expansions,
            "nodes_expanded": len(self.expansions),
            "duplicates_dropped": self.duplicates_dropped,
            "model_calls": self.model_calls,
            "generation_calls": self.generation_calls,
            "verifier_calls": len(self.verifier_keys),
        }

    def affordable(self, requests: list[tuple[Node, int]]) -> list[tuple[Node, int]]:
        """The longest prefix of ``requests`` whose worst case fits ``max_model_calls``: one
        generation per request plus ``verifier.max_calls_per_score`` per thought. Empty when
        nothing fits (the search should stop)."""
        if self.max_model_calls is None:
            return requests
        left, fits = self.max_model_calls - self.model_calls, []
        for node, n in requests:
            left -= 1 + n * self.verifier.max_calls_per_score
            if left < 0:
                break
            fits.append((node, n))
        return fits

    def result(self, best: Candidate | None, steps: int, seconds: float) -> SearchResult:
        """Summarize the search; ``solved`` is checked by the task on the best terminal, the vote on all."""
        answer = best.result.answer if best is not None and best.result.terminal else None
        solved = self.task.is_correct(self.problem, answer)
        return SearchResult(
            solved=bool(solved),
            answer=answer,
            best=best.node if best is not None else None,
            expansions=list(self.expansions),
            off_path_expansions=self.off_path_expansions,
            steps=steps,
            seconds=seconds,
            extra=self.vote(),
            duplicates_dropped=self.duplicates_dropped,
            generation_calls=self.generation_calls,
            verifier_calls=len(self.verifier_keys),
        )

    def vote(self) -> dict[str, Any]:
        """Self-consistency over the terminals seen: the majority answer, its count, its correctness.

        Answers are equal under the task's ``answers_match``. Empty when no terminal gave an answer.
        """
        answer, count = majority_vote([c.result.answer for c in self.terminals], self.task.answers_match)
        if answer is None:
            return {}
        correct = self.task.is_correct(self.problem, answer)
        return {"vote_answer": answer, "vote_count": count, "vote_correct": bool(correct)}

    # ---- helpers -------------------------------------------------------------------------
    def _first_visit(self, state: Any) -> bool:
        """Record ``state``; False when a state with its key was seen before in this search."""
        key = self.task.state_key(state)
        if key is None:
            return True
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _duplicate(self, thought: Node, result: StepResult) -> bool:
        """Whether ``thought`` leads to a state already seen; a duplicate is counted and released."""
        if self._first_visit(result.state):
            return False
        self.duplicates_dropped += 1
        thought.meta.update(valid=True, duplicate=True, state=result.state)
        if self.release_pruned:
            self.rt.release(thought)
        return True

    def _count_vote(self, answer: str | None) -> None:
        """Add a finished path's answer to the running vote (grouped as :func:`majority_vote` does)."""
        if answer is None:
            return
        for i, (first, count) in enumerate(self._vote_groups):
            if self.task.answers_match(first, answer):
                self._vote_groups[i] = (first, count + 1)
                return
        self._vote_groups.append((answer, 1))

    def _record_expansion(self, node: Node) -> None:
        if self.expansions:
            prev = self.rt.nodes.get(self.expansions[-1])
            if prev is None or not _extends(node, prev):
                self.off_path_expansions += 1
        self.expansions.append(node.id)


def _constrained(sampling: SamplingParams, plan: Proposal) -> SamplingParams:
    """``sampling`` under the proposal's regex or grammar (unchanged when it has neither)."""
    if plan.regex is None and plan.grammar is None:
        return sampling
    return replace(sampling, regex=plan.regex, grammar=plan.grammar)


def _extends(node: Node, prev: Node) -> bool:
    """True when ``prev`` lies on ``node``'s path (node continues the same branch)."""
    cur: Node | None = node
    while cur is not None:
        if cur is prev:
            return True
        cur = cur.parent
    return False


def _calls(items: list[int], rows: list[int]) -> list[list[int]]:
    """``items`` in order, cut into calls of at most ``MAX_ROWS`` rows (``rows``: each item's); an item
    is never split (each asks at most ``MAX_ROWS``: :func:`check_thoughts`). The children are the same
    as one call's: a row's stream is seeded by its node and its index under it, never by its call."""
    calls: list[list[int]] = []
    total = MAX_ROWS
    for item, n in zip(items, rows, strict=True):
        if total + n > MAX_ROWS:
            calls.append([])
            total = 0
        calls[-1].append(item)
        total += n
    return calls
