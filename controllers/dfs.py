"""ToT DFS: go down the best child first, prune children below a value threshold, backtrack at dead ends."""

from __future__ import annotations

from arbor_runtime import Node
from controllers.base import Candidate, Controller, SearchResult


class DFSController(Controller):
    """Depth-first Tree-of-Thought search (Yao et al. 2023) with value pruning and backtracking.

    Each visit expands one node into ``n_generate`` thoughts; children scoring below
    ``value_threshold`` are pruned and the rest are visited best first. A node with no child left
    is a dead end: the search backtracks to the nearest ancestor with an unvisited child. It stops
    at the first terminal whose verifier score reaches 1.0, or after ``max_visits`` expansions.

    Args:
        n_generate: thoughts sampled per visited node.
        value_threshold: children scoring below it are pruned (ToT's ``v_th``).
        max_visits: cap on visited (expanded) states.
        **kwargs: see :class:`~controllers.base.Controller`.

    ``SearchResult.extra`` holds ``backtracks`` (visits that resumed at an earlier node instead of
    going deeper) and ``visits``.
    """

    name = "dfs"

    def __init__(
        self, *args, n_generate: int = 5, value_threshold: float = 0.5, max_visits: int = 100, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        if n_generate < 1 or max_visits < 1:
            raise ValueError(f"dfs needs n_generate >= 1 and max_visits >= 1, got {n_generate} and {max_visits}")
        self.n_generate, self.value_threshold, self.max_visits = n_generate, value_threshold, max_visits
        self.visits, self.backtracks, self._best = 0, 0, None

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        self.visits, self.backtracks, self._best = 0, 0, None
        self._visit(self.root_candidate(root))
        return self.visits, self._best

    def result(self, best: Candidate | None, steps: int, seconds: float) -> SearchResult:
        res = super().result(best, steps, seconds)
        res.extra.update(backtracks=self.backtracks, visits=self.visits)
        return res

    # ---- recursion -----------------------------------------------------------------------
    def _visit(self, cand: Candidate) -> bool:
        """Expand ``cand`` and search its children best first; True when the search must stop."""
        self.visits += 1
        kids = self.rank(self.expand([(cand.node, self.n_generate)])[0])
        self._best = self.best_terminal(self._best, kids)
        if self.is_solution(self._best):
            return True
        keep = [c for c in kids if c.result.valid and not self.is_terminal(c) and c.score >= self.value_threshold]
        self.prune([c for c in kids if c not in keep and c is not self._best])
        for i, child in enumerate(keep):
            if self.visits >= self.max_visits:
                return True
            if i > 0:  # the previous child's subtree was a dead end: resume at this node
                self.backtracks += 1
            if self._visit(child):
                return True
            if not self._holds_best(child):
                self.prune([child])  # exhausted without a solution: never returned to
        return False

    def _holds_best(self, cand: Candidate) -> bool:
        best = self._best
        return best is not None and any(n is cand.node for n in best.node.path())
