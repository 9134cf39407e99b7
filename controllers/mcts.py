"""Monte Carlo tree search over thoughts: UCT selection, verifier or greedy-rollout values, backpropagation."""

from __future__ import annotations

import math
from dataclasses import replace

from arbor_runtime import Node
from controllers.base import Candidate, Controller, SearchResult


class MCTSController(Controller):
    """UCT search (Kocsis & Szepesvari 2006) on the thought tree, one simulation per iteration.

    An iteration descends from the root by UCT (``Q + exploration * sqrt(ln N_parent / N_child)``;
    unvisited children first, best key among them) to a node not yet expanded or terminal. A
    non-terminal leaf is expanded into ``n_generate`` thoughts and the simulation continues into
    its best valid child, whose value is its verifier score (``rollout=False``) or the score of a
    greedy rollout from it to a terminal (``rollout=True``; rollout nodes are released after
    scoring unless they hold the best terminal). A terminal leaf is valued by its own score. The
    value is backed up along the simulated path. Nodes whose thoughts are all invalid are dead and
    never selected again; the search stops early when the root is dead or a terminal scores 1.0.

    Visit counts: every node on a simulated path gets one visit, so with ``ends[n]`` simulations
    ending at ``n``, ``visits[n] == ends[n] + sum(visits[c] for c in tree[n])`` and the root's
    visits equal the iterations run (``steps``). ``SearchResult.extra`` holds ``visits``, ``ends``
    and ``tree`` (search children by node id) and ``rollouts``.

    Args:
        iterations: simulations to run.
        n_generate: thoughts sampled per expansion.
        exploration: UCT exploration weight ``c``.
        rollout: value leaves by a greedy rollout instead of the verifier score alone.
        **kwargs: see :class:`~controllers.base.Controller`.
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
        super().__init__(*args, **kwargs)
        if iterations < 1 or n_generate < 1 or exploration < 0:
            raise ValueError(
                f"mcts needs iterations >= 1, n_generate >= 1 and exploration >= 0, "
                f"got {iterations}, {n_generate} and {exploration}"
            )
        self.iterations, self.n_generate, self.exploration, self.rollout = iterations, n_generate, exploration, rollout
        self.rollout_sampling = replace(self.sampling, temperature=0.0)
        self._reset()

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        self._reset()
        top, steps = self.root_candidate(root), 0
        self._tree[root.id] = None  # known, not yet expanded
        while steps < self.iterations and root.id not in self._dead:
            steps += 1
            path = self.select(top)
            value, end = self._simulate(path)
            self._backpropagate(path if end is path[-1] else [*path, end], value)
            if self.is_solution(self._best):
                break
        return steps, self._best or self._most_visited(top)

    def select(self, top: Candidate) -> list[Candidate]:
        """UCT descent from the root to a leaf (unexpanded or terminal); returns the path."""
        path = [top]
        while self._tree.get(path[-1].node.id) and not self.is_terminal(path[-1]):
            parent = path[-1]
            options = [c for c in self._tree[parent.node.id] if c.node.id not in self._dead]
            path.append(max(options, key=lambda c: self._uct(parent, c)))
        return path

    def result(self, best: Candidate | None, steps: int, seconds: float) -> SearchResult:
        res = super().result(best, steps, seconds)
        tree = {k: [c.node.id for c in v or []] for k, v in self._tree.items()}
        res.extra.update(visits=dict(self._visits), ends=dict(self._ends), tree=tree, rollouts=self._rollouts)
        return res

    # ---- one simulation ------------------------------------------------------------------
    def _simulate(self, path: list[Candidate]) -> tuple[float, Candidate]:
        """Value the leaf of ``path``: returns (value, the node the simulation ends at)."""
        leaf = path[-1]
        if self.is_terminal(leaf):
            return leaf.score, leaf
        kids = self.expand([(leaf.node, self.n_generate)])[0]
        valid = self.rank([c for c in kids if c.result.valid])
        self.prune([c for c in kids if not c.result.valid])
        self._tree[leaf.node.id] = valid
        for child in valid:
            self._tree.setdefault(child.node.id, None)
        self._offer(valid)
        if not valid:
            self._mark_dead(path)
            return 0.0, leaf
        child = valid[0]
        if not self.rollout or self.is_terminal(child):
            return child.score, child
        return self._rollout(child), child

    def _rollout(self, start: Candidate) -> float:
        """Value of ``start`` by greedy single-thought expansions down to a terminal or an invalid thought.

        The rollout nodes are released afterwards unless they end in the best terminal so far (then
        they go once a better terminal is found).
        """
        self._rollouts += 1
        first = cur = self.expand([(start.node, 1)], self.rollout_sampling)[0][0]
        while cur.result.valid and not self.is_terminal(cur):
            cur = self.expand([(cur.node, 1)], self.rollout_sampling)[0][0]
        self._offer([cur])
        if self._best is cur:
            self._rollout_of[cur.node.id] = first
        else:
            self.prune([first])
        return cur.score if cur.result.valid else 0.0

    def _offer(self, cands: list[Candidate]) -> None:
        """Update the best terminal; a rollout path that held the old best is released."""
        old, self._best = self._best, self.best_terminal(self._best, cands)
        if old is not None and old is not self._best and old.node.id in self._rollout_of:
            self.prune([self._rollout_of.pop(old.node.id)])

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
        """Follow the most visited child from the root to the deepest valid node (None if none)."""
        cur = None
        kids = self._tree.get(top.node.id) or []
        while kids:
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
        self._best: Candidate | None = None
        self._rollout_of: dict[int, Candidate] = {}  # best terminal of a rollout -> the rollout's first thought
