"""ToT DFS: go down the best child first, prune children below a value threshold, backtrack at dead ends."""

from __future__ import annotations

import math

from arbor_runtime import Node
from arbor_runtime.controllers.base import Candidate, Controller, SearchResult, check_int, check_thoughts, is_number


class DFSController(Controller):
    """Depth-first Tree-of-Thought search (Yao et al. 2023) with value pruning and backtracking.

    Each visit expands one node into ``n_generate`` thoughts; children whose state was already seen
    are dropped, children scoring below ``value_threshold`` are pruned and the rest are visited best
    first. A node with no child left is a dead end: the search backtracks to the nearest ancestor
    with an unvisited child and releases the exhausted branch. It stops at the first verified
    solution, or after ``max_visits`` expansions.

    Args:
        n_generate: thoughts sampled per visited node.
        value_threshold: children scoring below it are pruned (ToT's ``v_th``); None takes the
            verifier's "live" threshold (``verifier.scale.live``: 1.0 for the symbolic Game of 24
            check, a mean verdict of "likely" for ``llm_value``).
        max_visits: cap on visited (expanded) states.
        **kwargs: see :class:`~arbor_runtime.controllers.base.Controller`.

    ``SearchResult.extra`` holds ``backtracks`` (visits that resumed at an earlier node instead of
    going deeper) and ``visits``.
    """

    name = "dfs"

    def __init__(
        self, *args, n_generate: int = 5, value_threshold: float | None = None, max_visits: int = 100, **kwargs
    ) -> None:
        self.check_own(n_generate=n_generate, value_threshold=value_threshold, max_visits=max_visits)
        super().__init__(*args, **kwargs)
        self.n_generate, self.max_visits = n_generate, max_visits
        self.value_threshold = self.verifier.scale.live if value_threshold is None else value_threshold
        self.visits, self.backtracks = 0, 0
        self._pending: list[list[Candidate]] = []  # per level of the descent: children not yet visited
        self._current: Candidate | None = None

    @classmethod
    def check_own(cls, n_generate: int = 5, value_threshold: float | None = None, max_visits: int = 100) -> None:
        check_thoughts("n_generate", n_generate, " (thoughts per expansion)")
        check_int("max_visits", max_visits, 1, " (expanded states at most)")
        if value_threshold is not None and not (is_number(value_threshold) and math.isfinite(value_threshold)):
            raise ValueError(f"value_threshold={value_threshold!r} must be a finite number or None (the verifier's)")

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        self.visits, self.backtracks, self._pending = 0, 0, []
        top = self.root_candidate(root)
        if self._can_visit(top):
            self._visit(top)
        return self.visits, self.best

    def frontier(self) -> list[Candidate]:
        """The node being visited and every child still waiting on the descent's stack."""
        current = [self._current] if self._current is not None else []
        return [*current, *(c for level in self._pending for c in level)]

    def result(self, best: Candidate | None, steps: int, seconds: float) -> SearchResult:
        res = super().result(best, steps, seconds)
        res.extra.update(backtracks=self.backtracks, visits=self.visits)
        return res

    # ---- recursion -----------------------------------------------------------------------
    def _visit(self, cand: Candidate) -> bool:
        """Expand ``cand`` and search its children best first; True when the search must stop."""
        self.visits += 1
        self._current = cand
        self.settle()  # ``cand`` is selected: what the descent left behind goes
        kids = self.rank(self.expand([(cand.node, self.n_generate)])[0])
        self.offer(kids)
        if self.is_solution(self.best):
            return True
        keep = [c for c in kids if c.result.valid and not self.is_terminal(c) and c.score >= self.value_threshold]
        self._pending.append(keep)
        self._current = None
        try:
            for i, child in enumerate(list(keep)):
                if not self._can_visit(child):
                    return True
                keep.remove(child)
                if i > 0:  # the previous child's subtree was a dead end: resume at this node
                    self.backtracks += 1
                if self._visit(child):
                    return True
        finally:
            self._pending.pop()
        return False

    def _can_visit(self, cand: Candidate) -> bool:
        """Visits and model calls left for one more expansion."""
        return self.visits < self.max_visits and bool(self.affordable([(cand.node, self.n_generate)]))
