"""Search-level admission: when the budget cannot hold every search's active path, searches take turns.

Several searches (one thread each, told apart by their :class:`~arbor_runtime.engine.core.Account`)
share one runtime and one budget. Rows of different searches interleaved in shared steps evict and
rehydrate each other's paths again and again when the budget holds fewer active paths than there
are searches. :class:`Turns` decides, once per engine cycle, which searches may start work:

- the searches, in the order they first brought work (first come, first served), each with its
  *demand*: the paths its work in the engine reads (queued or decoding rows, a prefill, a choose
  pass) and the slots that work starts with; per tree it touched (its own, a value prompt's), a
  search keeps what its operations there asked for since its last expansion in that tree began
  (the frontier it expands, the children it appends to and scores), so the paths it returns to
  stay counted while its thread is between operations or works in another tree;
- when every open search's demand fits the budget at once, every search is admitted (all rows batch
  together, as without this rule);
- else the longest run of searches from the front of that order whose demands fit together
  (always the first: a lone search progresses exactly as before), the rest wait with their work
  queued. A search leaves the order when its account closes (the search ended); the next in line
  is admitted as room allows. A first search with no work in the engine for ``idle_seconds`` while
  others wait goes to the back (it may be waiting on one of them: a turn never deadlocks).

Work outside any account (``account=None``: a release after a search, single-threaded use) is
never held back. Plain bookkeeping: no tensor moves here; whether demands fit together is the memory
planner's answer (``fits``, :meth:`~arbor_runtime.planner.MemoryPlanner.holds`), and the memory
manager evicts and restores for whatever is admitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arbor_runtime.tree import Node

#: seconds a first search may bring no work while others wait before it goes to the back
IDLE_SECONDS = 1.0

#: (path end or None for a new root, slots) per piece of work a search has in the engine
Demand = Sequence[tuple["Node | None", int]]
#: whether work of these (path end, slots) entries fits the budget at once (the planner's answer)
Fits = Callable[[list[tuple["Node | None", int]]], bool]


@dataclass(slots=True)
class Turns:
    """Which searches may start work now (see the module docstring).

    Attributes:
        order: open searches (accounts) in the order they first brought work.
        admitted: ids of the accounts admitted this cycle.
        contended: whether the last cycle could not hold every search (turns were taken).
    """

    idle_seconds: float = IDLE_SECONDS
    order: list[object] = field(default_factory=list)
    admitted: set[int] = field(default_factory=set)
    contended: bool = False
    #: per account, per tree its work touched (None: a root not prefilled yet): (path end id -> entry)
    #: since its last expansion there began
    _last: dict[int, dict[int | None, dict[int | None, tuple[Node | None, int]]]] = field(default_factory=dict)
    _idle_since: float | None = None

    def admits(self, account: object | None) -> bool:
        """May work of ``account`` start now? (Work outside accounts always may.)"""
        return account is None or not self.contended or id(account) in self.admitted

    def update(
        self,
        demand: Mapping[int, tuple[object, Demand]],
        fits: Fits,
        fresh: Iterable[tuple[int, int]] = (),
        now: float | None = None,
    ) -> None:
        """Recompute the admitted searches from each account's demand now (``id(account)`` ->
        (account, demand); accounts with no work in the engine are absent); ``fits`` says whether
        demands fit the budget together. ``fresh``: (``id(account)``, tree id) where an expansion
        started this cycle (what the search asked for there before is forgotten)."""
        now = time.perf_counter() if now is None else now
        self.order = [a for a in self.order if not getattr(a, "closed", False)]
        known = {id(a) for a in self.order}
        for key, (account, _) in demand.items():
            if key not in known and not getattr(account, "closed", False):
                self.order.append(account)
                known.add(key)
            self._last.setdefault(key, {}).pop(None, None)  # a root being prefilled is a tree now
        for key, tree in fresh:
            self._last.get(key, {}).pop(tree, None)
        for key, (_, entries) in demand.items():
            mine = self._last.setdefault(key, {})
            for node, slots in entries:
                tree = None if node is None else node.tree_id
                mine.setdefault(tree, {})[None if node is None else node.id] = (node, slots)
        for key in [k for k in self._last if k not in known]:
            del self._last[key]
        self.contended = not fits(self._entries(self.order))
        if not self.contended:
            self.admitted, self._idle_since = known, None
            return
        self._rotate_idle(demand, now)
        prefix = self.order[:1]
        for account in self.order[1:]:
            if not fits(self._entries([*prefix, account])):
                break
            prefix.append(account)
        self.admitted = {id(a) for a in prefix} | (demand.keys() - known)  # closed accounts' last work

    def parked(self, nodes: Mapping[int, Node], block_ids: Iterable[int]) -> frozenset[int]:
        """Blocks (of ``block_ids``) of the trees of open searches that are not admitted, except
        those on an admitted search's paths or in its trees: what may leave for the host tier."""
        if not self.contended:
            return frozenset()
        mine = {t for key in self.admitted for t in self._last.get(key, ())}
        theirs = {t for a in self.order if id(a) not in self.admitted for t in self._last.get(id(a), ())} - mine
        if not theirs:
            return frozenset()
        admitted = self._entries(a for a in self.order if id(a) in self.admitted)
        keep = {n.id for e, _ in admitted if e for n in e.kv_path()}
        return frozenset(i for i in block_ids if i in nodes and nodes[i].tree_id in theirs and i not in keep)

    def waiting(self, demand: Mapping[int, tuple[object, Demand]]) -> list[object]:
        """Accounts with work in the engine that are not admitted (their work waits for a turn)."""
        return [acc for key, (acc, _) in demand.items() if self.contended and key not in self.admitted]

    def _entries(self, accounts: Iterable[object]) -> list[tuple[Node | None, int]]:
        return [e for a in accounts for tree in self._last.get(id(a), {}).values() for e in tree.values()]

    def _rotate_idle(self, demand: Mapping[int, tuple[object, Demand]], now: float) -> None:
        """The first search goes to the back when it brought no work for ``idle_seconds`` while
        another search has work waiting."""
        first = self.order[0]
        others_wait = any(key != id(first) for key in demand)
        if id(first) in demand or not others_wait:
            self._idle_since = None
            return
        if self._idle_since is None:
            self._idle_since = now
        elif now - self._idle_since >= self.idle_seconds:
            self.order.append(self.order.pop(0))
            self._idle_since = None
