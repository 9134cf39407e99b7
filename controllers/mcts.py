"""Monte Carlo tree search over thoughts: UCT selection, verifier or greedy-rollout values, backpropagation."""

from __future__ import annotations

import math
from dataclasses import replace

from arbor_runtime import Node
from arbor_runtime.controllers.base import Candidate, Controller, SearchResult, check_int, check_thoughts, is_number


class MCTSController(Controller):
    """UCT search (Kocsis & Szepesvari 2006) on the thought tree, one simulation per iteration.

    An iteration descends from the root by UCT (``Q + exploration * sqrt(ln N_parent / N_child)``;
    unvisited children first, best key among them) until it reaches a node visited for the first
    time, a terminal, or a visited node not yet expanded. Every node is valued the same way on its
    first visit: its own verifier score (``rollout=False``) or the score of a greedy rollout from it
    to a terminal (``rollout=True``; the rollout's nodes are released afterwards unless they end in
    the best answer). A terminal is valued by its score. A visited node that is reached again is
    expanded into ``n_generate`` thoughts (duplicates of states already in the tree dropped) and
    the simulation goes on into its best child, valued as above; so siblings are valued alike,
    whichever was expanded first. The value is backed up along the simulated path. Nodes whose
    thoughts are all invalid or duplicates are dead, never selected again and released; finished
    non-best paths are released too. The search stops early when the root is dead, at a verified
    solution, or when ``max_model_calls`` cannot pay for the next expansion.

    Visit counts: every node on a simulated path gets one visit, so with ``ends[n]`` simulations
    ending at ``n``, ``visits[n] == ends[n] + sum(visits[c] for c in tree[n])`` and the root's
    visits equal the iterations run (``steps``). ``SearchResult.extra`` holds ``visits``, ``ends``,
    ``values`` (the backed-up value sums), ``tree`` (search children by node id) and ``rollouts``.

    Args:
        iterations: simulations to run.
        n_generate: thoughts sampled per expansion.
        exploration: UCT exploration weight ``c``.
        rollout: value a node on its first visit by a greedy rollout instead of its score alone.
        **kwargs: see :class:`~arbor_runtime.controllers.base.Controller`.
    """

    name = "mcts"

    def __init__(
        self,
        *args,
        iterations: int = 50,
        n_generate: int = 3,
        exploration: float = 1.0,
        rollout: bool = False,
        **kwargs,
    ) -> None:
        self.check_own(iterations=iterations, n_generate=n_generate, exploration=exploration, rollout=rollout)
        super().__init__(*args, **kwargs)
        self.iterations, self.n_generate, self.exploration, self.rollout = iterations, n_generate, exploration, rollout
        self.rollout_sampling = replace(self.sampling, temperature=0.0)
        self._reset()

    @classmethod
    def check_own(
        cls, iterations: int = 50, n_generate: int = 3, exploration: float = 1.0, rollout: bool = False
    ) -> None:
        check_int("iterations", iterations, 1, " (simulations)")
        check_thoughts("n_generate", n_generate, " (thoughts per expansion)")
        if not is_number(exploration) or not math.isfinite(exploration) or exploration < 0:
            raise ValueError(f"exploration={exploration!r} must be a finite number >= 0 (the UCT weight c)")
        if not isinstance(rollout, bool):
            raise ValueError(f"rollout={rollout!r} must be true or false")

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        self._reset()
        top, steps = self.root_candidate(root), 0
        self._top = top
        self._tree[root.id] = None  # known, not yet expanded
        while steps < self.iterations and root.id not in self._dead and not self.is_solution(self.best):
            path = self.select(top)
            leaf = path[-1]
            if self.is_terminal(leaf) or (leaf is not top and self._visits.get(leaf.node.id, 0) == 0):
                value = self._first_value(leaf)  # a terminal, or a first visit: no expansion
            elif not self.affordable([(leaf.node, self.n_generate)]):
                break
            else:
                value, child = self._expand(path)
                path = path if child is None else [*path, child]
            steps += 1
            self._backpropagate(path, value)
            self.settle()
        return steps, self.best or self._most_visited(top)

    def select(self, top: Candidate) -> list[Candidate]:
        """UCT descent from the root to a node visited for the first time, a terminal or an unexpanded node."""
        path = [top]
        while self._tree.get(path[-1].node.id) and not self.is_terminal(path[-1]):
            parent = path[-1]
            options = [c for c in self._tree[parent.node.id] if c.node.id not in self._dead]
            path.append(max(options, key=lambda c: self._uct(parent, c)))
            if self._visits.get(path[-1].node.id, 0) == 0:
                break
        return path

    def frontier(self) -> list[Candidate]:
        """Every node of the search tree that may still grow (not dead, not finished), and a rollout in flight."""
        tree = [c for kids in self._tree.values() for c in kids or []]
        top = [self._top] if self._top is not None else []
        grow = [c for c in [*top, *tree] if c.node.id not in self._dead and not self.is_terminal(c)]
        return [*grow, *self._rolling]

    def result(self, best: Candidate | None, steps: int, seconds: float) -> SearchResult:
        res = super().result(best, steps, seconds)
        tree = {k: [c.node.id for c in v or []] for k, v in self._tree.items()}
        visits = {k: v for k, v in self._visits.items() if v}
        res.extra.update(visits=visits, ends=dict(self._ends), values=dict(self._values), tree=tree)
        res.extra["rollouts"] = self._rollouts
        return res

    # ---- one simulation ------------------------------------------------------------------
    def _expand(self, path: list[Candidate]) -> tuple[float, Candidate | None]:
        """Expand the leaf of ``path``; returns (value, the child the simulation goes on into or None)."""
        kids = self.expand([(path[-1].node, self.n_generate)])[0]
        valid = self.rank([c for c in kids if c.result.valid])
        self._tree[path[-1].node.id] = valid
        for child in valid:
            self._tree.setdefault(child.node.id, None)
        self.offer(valid)
        if not valid:
            self._mark_dead(path)
            return 0.0, None
        return self._first_value(valid[0]), valid[0]

    def _first_value(self, cand: Candidate) -> float:
        """The value of ``cand`` on a visit without expansion: its score, or its greedy rollout's."""
        if not self.rollout or self.is_terminal(cand):
            return cand.score
        return self._rollout(cand)

    def _rollout(self, start: Candidate) -> float:
        """Value of ``start`` by greedy single-thought expansions down to a terminal or an invalid thought.

        Stops early, valued by the last open thought's score, when ``max_model_calls`` cannot pay for
        another step. The rollout's nodes are released at the next settle unless they end in the best
        answer.
        """
        self._rollouts += 1
        cur, self._rolling = start, [start]
        self.settle()  # the simulation goes on from ``start``: what its expansion dropped goes first
        while not self.is_terminal(cur) and self.affordable([(cur.node, 1)]):
            self._rolling = [cur]
            cur = self.expand([(cur.node, 1)], self.rollout_sampling, dedup=False)[0][0]
            if not cur.result.valid:
                break
        self._rolling = []
        self.offer([cur])
        return cur.score if cur.result.valid else 0.0

    def _backpropagate(self, path: list[Candidate], value: float) -> None:
        for cand in path:
            nid = cand.node.id
            self._visits[nid] = self._visits.get(nid, 0) + 1
            self._values[nid] = self._values.get(nid, 0.0) + value
        end = path[-1].node.id
        self._ends[end] = self._ends.get(end, 0) + 1

    # ---- helpers -------------------------------------------------------------------------
    def _uct(self, parent: Candidate, child: Candidate) -> tuple[float, float, float]:
        n = self._visits.get(child.node.id, 0)
        if n == 0:
            return (math.inf, *child.key)
        q = self._values[child.node.id] / n
        u = self.exploration * math.sqrt(math.log(self._visits[parent.node.id]) / n)
        return (q + u, *child.key)

    def _mark_dead(self, path: list[Candidate]) -> None:
        """The leaf has no valid thought: it is dead, and so is every ancestor left without a live child."""
        for cand in reversed(path):
            kids = self._tree.get(cand.node.id) or []
            if any(c.node.id not in self._dead for c in kids):
                return
            self._dead.add(cand.node.id)

    def _most_visited(self, top: Candidate) -> Candidate | None:
        """Follow the most visited live child from the root to the deepest valid node (None if none)."""
        cur = None
        kids = self._tree.get(top.node.id) or []
        while kids := [c for c in kids if c.node.id not in self._dead]:
            cur = max(kids, key=lambda c: (self._visits.get(c.node.id, 0), *c.key))
            kids = self._tree.get(cur.node.id) or []
        return cur

    def _reset(self) -> None:
        self._tree: dict[int, list[Candidate] | None] = {}
        self._visits: dict[int, int] = {}
        self._values: dict[int, float] = {}
        self._ends: dict[int, int] = {}
        self._dead: set[int] = set()
        self._rollouts = 0
        self._rolling: list[Candidate] = []  # the open end of a rollout in progress
        self._top: Candidate | None = None  # the root's candidate
