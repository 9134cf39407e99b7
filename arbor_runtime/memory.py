"""Memory manager: turns runtime operations into events, asks the policy, carries out plans.

The runtime tells it what is about to happen (``prepare``: these nodes will be expanded with
this many working tokens), what happened (``after``: these blocks were created), and each step's
working tokens (``reserve``). It derives the events (branch switch, node end, memory
threshold), builds the policy's view, executes retention plans on the store, restores the
active path for policies that keep it whole, and enforces the budget: resident blocks plus
working tokens never pass ``budget_tokens``; when they would, :class:`KVBudgetExceeded`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from arbor_runtime.errors import KVBudgetExceeded
from arbor_runtime.events import BranchSwitch, Event, EventLog, MemoryThreshold, NodeEnd
from arbor_runtime.kv import KVStore
from arbor_runtime.policies.base import BlockView, MemoryView, Policy, RetentionPlan
from arbor_runtime.tree import Node


class MemoryManager:
    """Event-driven bridge between the runtime's tree, the policy and the store.

    Args:
        store: the block store; policy: the retention policy; nodes: the runtime's live nodes by id.
        recompute: rebuilds a block whose tokens were dropped from every tier (ancestors whole).
    """

    def __init__(
        self, store: KVStore, policy: Policy, nodes: dict[int, Node], recompute: Callable[[Node], None]
    ) -> None:
        self.store, self.policy, self.nodes, self._recompute = store, policy, nodes, recompute
        self.events = EventLog()
        self.active: frozenset[int] = frozenset()
        self._leaves: set[int] = set()  # the current frontier: last expansion's targets and new blocks
        self._sampled: set[int] = set()  # the children the last expansion sampled
        self.step = 0
        self.peak_tokens = 0

    @property
    def budget(self) -> int | None:
        return self.policy.budget_tokens

    # ---- protocol used by the runtime ----------------------------------------------------
    def prepare(self, targets: Sequence[Node], reserve: int) -> None:
        """Before an operation on ``targets`` needing ``reserve`` working tokens at most."""
        self.step += 1
        self._check_switch(targets)
        self.active = frozenset(n.id for t in targets for n in t.path() if n.id in self.store)
        path = _ordered_path_nodes(targets, self.active)
        missing = sum(self._missing(n) for n in path) if self.policy.keep_active_whole else 0
        if self.budget is not None and self.store.resident_tokens + missing + reserve > self.budget:
            need = self.store.resident_tokens + missing + reserve - self.budget
            self.emit(MemoryThreshold(self.store.resident_tokens, self.budget, need), self.budget - reserve - missing)
        if self.policy.keep_active_whole:
            for node in path:  # top-down: a block is rebuilt over whole ancestors
                self._make_whole(node)

    def reserve(self, working: int, where: str, ahead: int = 0) -> None:
        """Check that resident blocks + ``working`` tokens fit; ask the policy once, else raise.

        ``ahead``: when the policy has to make room, it makes this much more than needed now (the
        next decode steps' tokens), so a plan is not computed at every step.
        """
        needed = self.store.resident_tokens + working
        if self.budget is not None and needed > self.budget:
            target = self.budget - working - ahead
            self.emit(MemoryThreshold(self.store.resident_tokens, self.budget, needed - self.budget), target)
            needed = self.store.resident_tokens + working
            if needed > self.budget:
                raise KVBudgetExceeded(needed, self.budget, where)
        self.peak_tokens = max(self.peak_tokens, needed)

    def after(self, targets: Sequence[Node], created: Sequence[Node], forced: bool = False) -> None:
        """After an operation: NodeEnd per new block, then a threshold check.

        ``forced``: the operation appended a forced block. Appended to a child of the last expansion
        (a task's forced text after a sampled thought), it continues that expansion's frontier;
        appended anywhere else it starts a new one, like an expansion of its parent.
        """
        leaves = {n.id for n in targets} | {n.id for n in created}
        if forced and all(t.id in self._sampled for t in targets):
            self._leaves |= leaves
        else:
            self._leaves = leaves
            self._sampled = set() if forced else {n.id for n in created}
        self.active = self.active | {n.id for n in created}
        for node in created:
            self.emit(NodeEnd(node.id), self._threshold_target())
        if self.budget is not None and self.store.resident_tokens > self._threshold_target():
            self.emit(MemoryThreshold(self.store.resident_tokens, self.budget), self._threshold_target())

    def forget(self, node_ids: Sequence[int]) -> None:
        """Released blocks leave the active set."""
        gone = set(node_ids)
        self.active = frozenset(self.active - gone)
        self._leaves -= gone

    def emit(self, event: Event, target: int) -> None:
        """Deliver an event to the policy, carry out its plan, log the result."""
        plan = self.policy.on_event(event, self.view(target))
        if plan:
            self.execute(plan)
        self.events.add(
            event,
            self.step,
            self.store.resident_tokens,
            self.store.host_tokens,
            len(self.store.journal),
            len(plan or ()),
        )

    def view(self, target: int) -> MemoryView:
        blocks = [BlockView(self.nodes[i], self.store.get(i), i in self.active) for i in sorted(self.store.block_ids())]
        return MemoryView(blocks=blocks, active=self.active, budget=self.budget, target=target)

    def execute(self, plan: RetentionPlan) -> None:
        """Apply a plan; active blocks are never shrunk under a policy that keeps them whole."""
        for block_id, keep in plan.keep.items():
            if self.policy.keep_active_whole and block_id in self.active:
                continue
            self.store.apply(block_id, keep, offload=self.policy.offload)
        for block_id in plan.drop_host:
            if block_id not in self.active:
                self.store.drop_host(block_id)

    # ---- internals -----------------------------------------------------------------------
    def _threshold_target(self) -> int:
        return int(self.policy.threshold * self.budget) if self.budget is not None else 1 << 62

    def _missing(self, node: Node) -> int:
        blk = self.store.get(node.id)
        return blk.length - blk.kept_tokens

    def _make_whole(self, node: Node) -> None:
        blk = self.store.get(node.id)
        if blk.whole:
            return
        if node.id in self.store.host:
            self.store.apply(node.id, _all(blk.length), offload=self.policy.offload)
        if not self.store.get(node.id).whole:
            self._recompute(node)

    def _check_switch(self, targets: Sequence[Node]) -> None:
        if not self._leaves:
            return
        switched = tuple(t.id for t in targets if not any(n.id in self._leaves for n in t.path()))
        if switched:
            last = max(self._leaves) if self._leaves else None
            self.emit(BranchSwitch(last, switched), self._threshold_target())


def _ordered_path_nodes(targets: Sequence[Node], active: frozenset[int]) -> list[Node]:
    """Active nodes, parents before children (depth order)."""
    seen: dict[int, Node] = {}
    for t in targets:
        for n in t.path():
            if n.id in active:
                seen[n.id] = n
    return sorted(seen.values(), key=lambda n: (n.depth, n.id))


def _all(length: int):
    import torch

    return torch.arange(length)
