"""Step-level beam search: every open beam entry samples ``samples_per_node`` thoughts, the best ``beam_width`` stay."""

from __future__ import annotations

from arbor_runtime import Node
from arbor_runtime.controllers.base import Candidate, Controller, SearchResult, check_int, check_thoughts


class BeamController(Controller):
    """Beam search over thoughts, scored step by step by the verifier, with a terminal beam.

    Each step expands every open beam entry (one batch), drops candidates whose state was already
    seen, and ranks the rest by :attr:`~arbor_runtime.controllers.base.Candidate.key`: finished paths go to the
    *terminal beam* (the best ``beam_width`` finished paths; only the best stays resident), open
    ones compete for the ``beam_width`` slots of the next beam, so a finished path never takes an
    open path's slot (in llm-reasoners' ``BeamSearch`` a path holds a slot for the step it finishes
    in). The search ends after ``max_depth`` steps, when the beam is empty, or at a verified
    solution. It returns the best finished path; when nothing finished, the best unfinished path
    of the deepest beam (llm-reasoners moves the beam at ``max_depth`` into its terminal beam).

    Args:
        beam_width: open candidates kept after each step, and the terminal beam's size.
        samples_per_node: thoughts sampled from each open beam entry per step.
        max_depth: steps at most (None: the task's ``max_steps``).
        **kwargs: see :class:`~arbor_runtime.controllers.base.Controller`.

    ``SearchResult.extra["finished"]`` counts the finished paths in the terminal beam.
    """

    name = "beam"

    def __init__(
        self, *args, beam_width: int = 4, samples_per_node: int = 4, max_depth: int | None = None, **kwargs
    ) -> None:
        self.check_own(beam_width=beam_width, samples_per_node=samples_per_node, max_depth=max_depth)
        super().__init__(*args, **kwargs)
        self.beam_width, self.samples_per_node, self.max_depth = beam_width, samples_per_node, max_depth
        self.beam: list[Candidate] = []
        self.finished: list[Candidate] = []  # the terminal beam, best first
        self._unfinished: Candidate | None = None  # the best open candidate of the deepest beam

    @classmethod
    def check_own(cls, beam_width: int = 4, samples_per_node: int = 4, max_depth: int | None = None) -> None:
        check_int("beam_width", beam_width, 1, " (open candidates kept per step)")
        check_thoughts("samples_per_node", samples_per_node, " (thoughts per beam entry)")
        if max_depth is not None:
            check_int("max_depth", max_depth, 1, " or None (the task's max_steps)")

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        self.beam, self.finished, self._unfinished, steps = [self.root_candidate(root)], [], None, 0
        depth = self.max_depth or self.task.max_steps
        while self.beam and steps < depth and not self.is_solution(self.best):
            requests = self.affordable([(c.node, self.samples_per_node) for c in self.beam])
            if not requests:
                break
            steps += 1
            new = [c for group in self.expand(requests) for c in group if c.result.valid]
            done = [c for c in new if self.is_terminal(c)]
            self.offer(done)
            self.finished = self.rank(self.finished + done)[: self.beam_width]
            self.beam = self.rank([c for c in new if not self.is_terminal(c)])[: self.beam_width]
            self._unfinished = self.beam[0] if self.beam else self._unfinished
            self.settle()
        return steps, self.best or self._unfinished

    def frontier(self) -> list[Candidate]:
        """The open beam, and while nothing has finished, the best unfinished path (the fallback answer)."""
        fallback = [self._unfinished] if self.best is None and self._unfinished is not None else []
        return [*self.beam, *fallback]

    def result(self, best: Candidate | None, steps: int, seconds: float) -> SearchResult:
        res = super().result(best, steps, seconds)
        res.extra["finished"] = len(self.finished)
        return res
