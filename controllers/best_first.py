"""Best-first search: one global priority queue over the whole frontier, so the search jumps between branches."""

from __future__ import annotations

import heapq
import itertools

from arbor_runtime import Node
from arbor_runtime.controllers.base import Candidate, Controller, check_int, check_thoughts


class BestFirstController(Controller):
    """Expand the best open candidate anywhere in the tree, then queue its children.

    The priority is the candidate key (verifier score, then mean log-probability); ties go to the
    candidate queued first. A child whose state was already seen anywhere in the search is dropped,
    so no state is queued twice. Consecutive expansions often sit on different branches, which is
    what stresses a tree-aware KV manager: queued nodes stay resident because the search may come
    back to them; after each pop everything else is released (exhausted branches, invalid and
    finished non-best thoughts, a replaced best answer).

    Args:
        n_generate: thoughts sampled per expansion.
        max_expansions: cap on expanded nodes (= steps).
        **kwargs: see :class:`~arbor_runtime.controllers.base.Controller`.
    """

    name = "best_first"

    def __init__(self, *args, n_generate: int = 5, max_expansions: int = 50, **kwargs) -> None:
        self.check_own(n_generate=n_generate, max_expansions=max_expansions)
        super().__init__(*args, **kwargs)
        self.n_generate, self.max_expansions = n_generate, max_expansions
        self._queue: list[tuple[float, float, int, Candidate]] = []
        self._current: Candidate | None = None

    @classmethod
    def check_own(cls, n_generate: int = 5, max_expansions: int = 50) -> None:
        check_thoughts("n_generate", n_generate, " (thoughts per expansion)")
        check_int("max_expansions", max_expansions, 1, " (expanded nodes at most)")

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        order, self._queue, self._current, steps = itertools.count(), [], None, 0
        self._push(self.root_candidate(root), order)
        while self._queue and steps < self.max_expansions and not self.is_solution(self.best):
            if not self.affordable([(self._queue[0][-1].node, self.n_generate)]):
                break
            self._current = self.select()
            self.settle()
            steps += 1
            kids = self.expand([(self._current.node, self.n_generate)])[0]
            self.offer(kids)
            for kid in kids:
                if kid.result.valid and not self.is_terminal(kid):
                    self._push(kid, order)
            self._current = None
        return steps, self.best

    def select(self) -> Candidate:
        """Pop the best candidate of the whole frontier (it is expanded next)."""
        return heapq.heappop(self._queue)[-1]

    def frontier(self) -> list[Candidate]:
        """The queue, and the node being expanded."""
        current = [self._current] if self._current is not None else []
        return [*current, *(entry[-1] for entry in self._queue)]

    # ---- helpers -------------------------------------------------------------------------
    def _push(self, cand: Candidate, order: itertools.count) -> None:
        score, logprob = cand.key
        heapq.heappush(self._queue, (-score, -logprob, next(order), cand))
