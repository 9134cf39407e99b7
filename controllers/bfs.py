"""ToT BFS: each level samples ``n_generate`` thoughts per frontier node, keeps the best ``breadth``."""

from __future__ import annotations

from arbor_runtime import Node
from controllers.base import Candidate, Controller


class BFSController(Controller):
    """Breadth-first Tree-of-Thought search (Yao et al. 2023), one batch per level.

    Args:
        n_generate: thoughts sampled per frontier node and level.
        breadth: nodes kept per level (the ``b`` of ToT BFS).
        **kwargs: see :class:`~controllers.base.Controller`.
    """

    name = "bfs"

    def __init__(self, *args, n_generate: int = 5, breadth: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if n_generate < 1 or breadth < 1:
            raise ValueError(f"bfs needs n_generate >= 1 and breadth >= 1, got {n_generate} and {breadth}")
        self.n_generate, self.breadth = n_generate, breadth

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        frontier, best, steps = [root], None, 0
        for _ in range(self.task.max_steps):
            steps += 1
            cands = [c for group in self.expand([(n, self.n_generate) for n in frontier]) for c in group]
            ranked = sorted(cands, key=lambda c: c.key, reverse=True)
            terminals = [c for c in ranked if c.result.valid and self.is_terminal(c)]
            if terminals and (best is None or terminals[0].key > best.key):
                best = terminals[0]
            keep = [c for c in ranked if c.result.valid and not self.is_terminal(c)][: self.breadth]
            self.prune([c for c in ranked if c not in keep and c is not best])
            if (best is not None and best.score >= 1.0) or not keep:
                break
            frontier = [c.node for c in keep]
        return steps, best
