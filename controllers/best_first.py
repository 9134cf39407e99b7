"""Best-first search: one global priority queue over the whole frontier, so the search jumps between branches."""

from __future__ import annotations

import heapq
import itertools

from arbor_runtime import Node
from controllers.base import Candidate, Controller


class BestFirstController(Controller):
    """Expand the best open candidate anywhere in the tree, then queue its children.

    The priority is the candidate key (verifier score, then mean log-probability); ties go to the
    candidate queued first. Consecutive expansions often sit on different branches, which is what
    stresses a tree-aware KV manager: frontier nodes stay resident (never released) because the
    search may come back to them. Only invalid thoughts, finished non-best terminals and popped
    nodes whose every child is gone are released.

    Args:
        n_generate: thoughts sampled per expansion.
        max_expansions: cap on expanded nodes (= steps).
        **kwargs: see :class:`~controllers.base.Controller`.
    """

    name = "best_first"

    def __init__(self, *args, n_generate: int = 5, max_expansions: int = 50, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if n_generate < 1 or max_expansions < 1:
            raise ValueError(
                f"best_first needs n_generate >= 1 and max_expansions >= 1, got {n_generate} and {max_expansions}"
            )
        self.n_generate, self.max_expansions = n_generate, max_expansions
        self._popped: dict[int, Candidate] = {}
        self._root: Node | None = None

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        order = itertools.count()
        queue: list[tuple[float, float, int, Candidate]] = []
        self._popped, self._root, best, steps = {}, root, None, 0
        self._push(queue, self.root_candidate(root), order)
        while queue and steps < self.max_expansions:
            cand = self.select(queue)
            steps += 1
            kids = self.expand([(cand.node, self.n_generate)])[0]
            old, best = best, self.best_terminal(best, kids)
            for kid in kids:
                if kid.result.valid and not self.is_terminal(kid):
                    self._push(queue, kid, order)
            self.prune([k for k in kids if (not k.result.valid or self.is_terminal(k)) and k is not best])
            if old is not None and old is not best:
                self._drop(old)
            self._settle(cand.node)
            if self.is_solution(best):
                break
        return steps, best

    def select(self, queue: list[tuple[float, float, int, Candidate]]) -> Candidate:
        """Pop the best candidate of the whole frontier (it is expanded next)."""
        cand = heapq.heappop(queue)[-1]
        self._popped[cand.node.id] = cand
        return cand

    # ---- helpers -------------------------------------------------------------------------
    @staticmethod
    def _push(queue: list, cand: Candidate, order: itertools.count) -> None:
        score, logprob = cand.key
        heapq.heappush(queue, (-score, -logprob, next(order), cand))

    def _drop(self, cand: Candidate) -> None:
        """Release a terminal that is no longer the best, then whatever it leaves childless."""
        parent = cand.thought.parent
        self.prune([cand])
        if parent is not None:
            self._settle(parent)

    def _settle(self, node: Node) -> None:
        """Release popped nodes left without children, walking up (the frontier keeps its ancestors)."""
        while self.release_pruned and node is not self._root and not node.children and node.id in self._popped:
            cand = self._popped.pop(node.id)
            node = cand.thought.parent
            self.prune([cand])
