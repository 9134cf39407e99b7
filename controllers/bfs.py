"""ToT BFS: each level samples ``n_generate`` thoughts per frontier node, keeps the best ``breadth``."""

from __future__ import annotations

from arbor_runtime import Node
from arbor_runtime.controllers.base import Candidate, Controller, check_int, check_thoughts


class BFSController(Controller):
    """Breadth-first Tree-of-Thought search (Yao et al. 2023), one batch per level.

    Each level expands every frontier node (one batch), drops candidates whose state was already
    seen, and keeps the best ``breadth`` open candidates by key as the next frontier; finished
    paths compete for the best answer only. After the selection everything else is released. It
    stops after ``task.max_steps`` levels, at a verified solution, or when no open candidate is left.

    Args:
        n_generate: thoughts sampled per frontier node and level.
        breadth: nodes kept per level (the ``b`` of ToT BFS).
        **kwargs: see :class:`~arbor_runtime.controllers.base.Controller`.
    """

    name = "bfs"

    def __init__(self, *args, n_generate: int = 5, breadth: int = 3, **kwargs) -> None:
        self.check_own(n_generate=n_generate, breadth=breadth)
        super().__init__(*args, **kwargs)
        self.n_generate, self.breadth = n_generate, breadth
        self._frontier: list[Candidate] = []

    @classmethod
    def check_own(cls, n_generate: int = 5, breadth: int = 3) -> None:
        check_thoughts("n_generate", n_generate, " (thoughts per frontier node)")
        check_int("breadth", breadth, 1, " (nodes kept per level)")

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        self._frontier, steps = [self.root_candidate(root)], 0
        while self._frontier and steps < self.task.max_steps and not self.is_solution(self.best):
            requests = self.affordable([(c.node, self.n_generate) for c in self._frontier])
            if not requests:
                break
            steps += 1
            cands = [c for group in self.expand(requests) for c in group]
            self.offer(cands)
            self._frontier = self.rank([c for c in cands if c.result.valid and not self.is_terminal(c)])[: self.breadth]
            self.settle()
        return steps, self.best

    def frontier(self) -> list[Candidate]:
        """The nodes the next level expands."""
        return list(self._frontier)
