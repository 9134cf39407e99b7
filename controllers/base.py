"""Controller base: the search loop's vocabulary over the public Runtime API.

A controller grows a tree for one problem: ``select`` nodes to grow, ``expand`` them (the
runtime samples thoughts, the task interprets them, the verifier scores them), ``prune`` what is
not worth keeping, stop when ``is_terminal``, and report a ``result``. Controllers never touch
tensors; they only choose which node to expand next, which is all the memory manager needs to
see branch switches.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any

from arbor_runtime import Node, Runtime, SamplingParams
from tasks.answers import majority_vote
from tasks.base import Problem, Proposal, StepResult, Task
from verifiers.base import Verifier

#: a terminal scoring at least this is a verified solution: searches stop there
SOLUTION_SCORE = 1.0


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
            ``ends``, ``tree``, ``rollouts``), plus the self-consistency vote over every valid
            terminal with an answer, when there is one: ``vote_answer``, ``vote_count``,
            ``vote_correct``.
    """

    solved: bool
    answer: str | None
    best: Node | None
    expansions: list[int]
    off_path_expansions: int
    steps: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


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


class Controller(ABC):
    """Base class of search algorithms.

    Args:
        runtime: the runtime to grow trees in.
        task: interprets thoughts and checks answers.
        verifier: scores nodes; bound here to ``runtime`` and ``task`` (an LLM value verifier
            evaluates in the runtime with the task's value prompt).
        temperature / top_p: sampling of thoughts (stop strings and length come from the task).
        release_pruned: release pruned subtrees at once (frees their KV); False keeps them for
            tree-aware memory policies and tree output.
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
    ) -> None:
        self.rt, self.task, self.verifier = runtime, task, verifier
        verifier.bind(runtime, task)
        self.sampling = SamplingParams(
            max_new_tokens=task.max_thought_tokens, temperature=temperature, top_p=top_p, stop=list(task.stop)
        )
        self.release_pruned = release_pruned
        self.expansions: list[int] = []
        self.off_path_expansions = 0
        self.problem: Problem | None = None
        self.root: Node | None = None  # the tree of the last search
        self.terminals: list[Candidate] = []  # every valid terminal scored this search (for the vote)

    # ---- the loop ------------------------------------------------------------------------
    def solve(self, problem: Problem, seed: int | None = None) -> SearchResult:
        """Run the search on one problem; ``seed`` seeds its tree's sampling (default: the runtime's)."""
        start = time.perf_counter()
        self.problem, self.expansions, self.off_path_expansions, self.terminals = problem, [], 0, []
        root = self.rt.new_tree(self.task.prompt(problem), seed=seed)
        self.root = root
        root.meta["state"] = self.task.initial_state(problem)
        steps, best = self.search(root)
        return self.result(best, steps, time.perf_counter() - start)

    @abstractmethod
    def search(self, root: Node) -> tuple[int, Candidate | None]:
        """Grow the tree from ``root``; return (steps taken, best terminal candidate or None)."""

    # ---- vocabulary shared by controllers ------------------------------------------------
    def root_candidate(self, root: Node) -> Candidate:
        """The root as a candidate (valid, not terminal, score 0), so searches handle it like any node."""
        return Candidate(node=root, thought=root, result=StepResult(state=root.meta["state"]), score=0.0)

    def expand(self, requests: list[tuple[Node, int]], sampling: SamplingParams | None = None) -> list[list[Candidate]]:
        """Sample thoughts for (node, n) requests in one batch, interpret and score them.

        ``sampling`` overrides the controller's own parameters for this call (e.g. greedy rollouts).
        """
        for node, _ in requests:
            self._record_expansion(node)
        groups = self._propose(requests, sampling or self.sampling)
        return [
            [self.evaluate(parent, child) for child in kids] for (parent, _), kids in zip(requests, groups, strict=True)
        ]

    def _propose(self, requests: list[tuple[Node, int]], sampling: SamplingParams) -> list[list[Node]]:
        """Children per request as the task proposes them (``Task.propose``): the model's best ``n`` of
        the task's choices (``Runtime.choose``), or ``n`` samples (under the task's regex, if any)."""
        plans = [self.task.propose(self.problem, node.meta["state"]) for node, _ in requests]
        out: list[list[Node]] = [[] for _ in requests]
        for i, ((node, n), plan) in enumerate(zip(requests, plans, strict=True)):
            if plan.choices:
                out[i] = self.rt.choose(node, list(plan.choices), keep=min(n, len(plan.choices))).kept
        free = [i for i, plan in enumerate(plans) if not plan.choices]
        if free:
            params = [_constrained(sampling, plans[i]) for i in free]
            kids = self.rt.expand_many([requests[i] for i in free], params)
            for i, group in zip(free, kids, strict=True):
                out[i] = group
        return out

    def evaluate(self, parent: Node, thought: Node) -> Candidate:
        """Let the task interpret ``thought``, append its forced text, score the result."""
        result = self.task.step(self.problem, parent.meta["state"], thought.text)
        node = thought
        if result.valid and result.forced_text:
            node = self.rt.append(thought, result.forced_text)
        score = self.verifier.score_node(self.problem, result, node) if result.valid else 0.0
        node.meta.update(state=result.state, terminal=result.terminal, valid=result.valid, reason=result.reason)
        thought.meta.setdefault("valid", result.valid)
        self.rt.set_value(node, score)
        cand = Candidate(node=node, thought=thought, result=result, score=score)
        if result.valid and self.is_terminal(cand):
            self.terminals.append(cand)
        return cand

    def is_terminal(self, cand: Candidate) -> bool:
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

    @staticmethod
    def is_solution(cand: Candidate | None) -> bool:
        """Whether ``cand`` scores as a verified solution (the search may stop)."""
        return cand is not None and cand.score >= SOLUTION_SCORE

    def prune(self, cands: list[Candidate]) -> None:
        """Drop candidates the search will not return to (releases their KV when configured)."""
        if self.release_pruned:
            for cand in cands:
                if not cand.thought.released:
                    self.rt.release(cand.thought)

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
