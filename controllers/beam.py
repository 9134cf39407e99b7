"""Step-level beam search: every beam entry samples ``samples_per_node`` thoughts, the best ``beam_width`` stay."""

from __future__ import annotations

from arbor_runtime import Node
from controllers.base import Candidate, Controller


class BeamController(Controller):
    """Beam search over thoughts, scored step by step by the verifier.

    Unlike ToT BFS, finished paths stay in the beam and compete with open ones: each step ranks the
    terminals already in the beam together with the new thoughts and keeps the top ``beam_width`` by
    :attr:`~controllers.base.Candidate.key`. The search ends when the beam holds only terminals, a
    verified solution is found, or ``task.max_steps`` steps have run.

    Args:
        beam_width: candidates kept after each step.
        samples_per_node: thoughts sampled from each open beam entry per step.
        **kwargs: see :class:`~controllers.base.Controller`.
    """

    name = "beam"

    def __init__(self, *args, beam_width: int = 4, samples_per_node: int = 4, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if beam_width < 1 or samples_per_node < 1:
            raise ValueError(
                f"beam needs beam_width >= 1 and samples_per_node >= 1, got {beam_width} and {samples_per_node}"
            )
        self.beam_width, self.samples_per_node = beam_width, samples_per_node

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        beam, best, steps = [self.root_candidate(root)], None, 0
        while steps < self.task.max_steps:
            open_ = [c for c in beam if not self.is_terminal(c)]
            if not open_:
                break
            steps += 1
            new = [c for group in self.expand([(c.node, self.samples_per_node) for c in open_]) for c in group]
            finished = [c for c in beam if self.is_terminal(c)]
            pool = self.rank(finished + [c for c in new if c.result.valid])
            beam = pool[: self.beam_width]
            best = self.best_terminal(best, pool)  # a solution outside the beam still counts
            dropped = pool[self.beam_width :] + [c for c in new if not c.result.valid]
            self.prune([c for c in dropped if c is not best])
            if self.is_solution(best) or not beam:
                break
        return steps, best
