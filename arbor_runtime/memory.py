"""Memory manager: carries out what the planner decided, and turns operations into policy events.

Device KV is one pool of slots (kv/pool.py); with a budget the pool *is* the budget, so what the
manager promises is what the process allocates. What fits, how room is made and what a policy's
plan does to the store are decided by the pure :class:`~arbor_runtime.planner.MemoryPlanner`
(``self.planner``), which moves nothing; the manager executes, and decides nothing itself:

- ``admit(plan)``: an admission the planner made (its rows' room, whole paths or, below the
  floor, the pinned tokens): the policy's retention plan for that room (evictions), then the host
  spans of the admitted paths restored (the planner listed what only a recompute brings back).
- ``make_room(need, ahead, active)``: the planner's :class:`~arbor_runtime.plans.RoomPlan` for
  ``need`` more slots carried out (parked blocks to the host, one plan of the policy); False when
  the room is still short (the scheduler's plan says what happens then).
- ``below_floor(ends, need, ahead)``: room for a lone row whose path does not fit whole, under a
  policy that degrades: the planner pins what must stay, the policy's plan keeps the rest of the
  path by value (evicting to the host, bringing host tokens back) and empties the inactive blocks.

It also derives the events (branch switch, node end, memory threshold) the policies react to, and
logs them. The manager never calls back into the runtime.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch

from arbor_runtime.events import BranchSwitch, Event, EventLog, MemoryThreshold, NodeEnd
from arbor_runtime.kv import KVStore
from arbor_runtime.planner import MemoryPlanner, union
from arbor_runtime.plans import AdmitPlan, RoomPlan
from arbor_runtime.policies.base import BlockView, LazyBlocks, MemoryView, Policy, RetentionPlan
from arbor_runtime.tree import Node, ordered_path_nodes, path_ids

log = logging.getLogger(__name__)


class MemoryManager:
    """Admission, events and plan execution over one store and one policy.

    Args:
        store: the block store (its pool holds every device KV slot).
        policy: the retention policy (asked for plans); nodes: the runtime's live nodes by id.
        planner: what fits and how room is made (the pure arithmetic the scheduler decides by too).
    """

    def __init__(self, store: KVStore, policy: Policy, nodes: dict[int, Node], planner: MemoryPlanner) -> None:
        self.store, self.policy, self.nodes, self.planner = store, policy, nodes, planner
        self.events = EventLog()
        #: events are also logged here while set (the account of the work being carried out)
        self.account = None
        self.active: frozenset[int] = frozenset()
        self._leaves: dict[int, set[int]] = {}  # per tree: the frontier (last expansion's targets and new blocks)
        self._sampled: dict[int, set[int]] = {}  # per tree: the children its last expansion sampled
        self.step = 0
        #: seconds spent, running totals: the policy computing plans, their evictions carried out,
        #: restores from the host tier (metrics.MEMORY_SECONDS maps them to metrics fields)
        self.seconds = {"plan": 0.0, "evict": 0.0, "restore": 0.0}
        #: blocks of searches waiting for their turn (engine/turns.py): when room is short they go
        #: to the host tier in one go, before the policy is asked to evict the running searches' blocks
        self.parked: frozenset[int] = frozenset()

    @property
    def budget(self) -> int | None:
        """Device pool slots (the planner's; events and views name them)."""
        return self.planner.budget

    # ---- operation protocol --------------------------------------------------------------
    def begin(self, targets: Sequence[Node], account=None) -> None:
        """A new operation on ``targets`` starts: count the step, detect a branch switch (per tree)."""
        self.step += 1
        self._check_switch(targets)

    def prefetch(self, work: Sequence[tuple[Node, int]], reserve: int = 0) -> int:
        """Restores start as soon as the search's choice is known: the host spans of the paths to the
        new expansion's nodes (``work``: (node, its thought's slots) per request) come back now, in
        one batch issued on the restore lane, when the planner says they fit in free slots as they
        are (:meth:`MemoryPlanner.prefetches`); its admission finds them resident. With CUDA the
        copies run under whatever the engine computes before that admission; on the CPU they are the
        same copies, made a little earlier. Returns the tokens brought back."""
        hosted = self._hosted([n for n, _ in work], frozenset(self.store.block_ids()))
        missing = sum(int(self.store.host.indices(n.id).numel()) for n in hosted)
        if not self.planner.prefetches(work, missing, reserve):
            return 0
        self._restore_whole(hosted)
        self.store.prefetch()
        return missing

    def admit(self, plan: AdmitPlan, ends: Sequence[Node]) -> None:
        """Carry out an admission the planner made for the paths to ``ends`` (the admitted queue
        entries): the policy is asked for the room they need (evictions), and their paths' host spans
        come back when the plan makes them whole (what no tier holds is the plan's ``recompute``,
        rebuilt by the runner next)."""
        if plan.rows == 0:
            return
        self.active = plan.active
        if plan.pinned is not None:  # below the floor: nothing is recomputed, the plan decides the path
            self._fit_below_floor(plan.pinned, plan.need, ahead=0)
            return
        self._make_room(plan.need, ahead=0)
        if plan.whole:
            self._make_whole(ends)
        self.store.prefetch()  # the plan's restores start copying now, before the step's forward

    def make_room(self, need: int, ahead: int = 0, active: Iterable[Node] = ()) -> bool:
        """Room for ``need`` more slots next to the ``active`` paths; ask the policy once if short.

        ``ahead``: when the policy has to plan, it makes this much more room than needed now (the
        next decode steps), so a plan is not computed at every step; at most an eighth of the
        budget, so a tight budget is not emptied for tokens that may never come.
        """
        self.active = frozenset(i for i in path_ids(active) if i in self.store)
        return self._make_room(need, ahead)

    def below_floor(self, ends: Sequence[Node], need: int, ahead: int = 0) -> bool:
        """Room for ``need`` more slots for a lone row at ``ends`` whose path does not fit whole
        (see :meth:`MemoryPlanner.pinned`); False when not even its pinned tokens fit."""
        pinned = self.planner.pinned(ends, need)
        if pinned is None:
            return False
        self.active = frozenset(i for i in path_ids(ends) if i in self.store)
        self._fit_below_floor(pinned, need, ahead)
        return self.planner.has_free(need)

    def restore_ranked(self, wants: Sequence[tuple[int, torch.Tensor]], reserve: int = 0) -> int:
        """Bring host spans of the active paths back in the order given, keeping ``reserve`` slots
        free for the rows' growth. Room comes from free slots, else from one plan of the policy over
        the inactive blocks (as making the path whole would) for as much as they all need; a span
        that does not fit then is skipped for the next ones. ``wants``: (block id, block-local tokens on the host tier).
        Returns the tokens restored (the copies start before the next forward)."""
        wants = [(b, idx) for b, idx in wants if idx.numel() and b in self.store]
        start = time.perf_counter()
        room = self.planner.ranked_room(sum(int(idx.numel()) for _, idx in wants), set(self.active), reserve)
        if room:  # one plan for the room all of them could take
            self._make_room(room, 0)
        restored = 0
        for block_id, idx in wants:
            n = int(idx.numel())
            if not self.planner.has_free(n, reserve):
                continue
            self._restore(block_id, torch.cat([self.store.get(block_id).kept.cpu(), idx.cpu()]))
            restored += n
        if restored:
            self.store.prefetch()
        self.seconds["restore"] += time.perf_counter() - start
        return restored

    def compress(self, target: int) -> None:
        """One MemoryThreshold asking the policy to bring resident blocks down to ``target`` now."""
        self.step += 1
        resident = self.store.resident_tokens
        if resident > target:
            self.emit(MemoryThreshold(resident, self.budget, resident - target), target)

    def node_end(self, node: Node) -> None:
        """A new block is complete and in the store."""
        self.emit(NodeEnd(node.id), self.planner.threshold_target())

    def after(
        self, targets: Sequence[Node], created: Sequence[Node], forced: bool = False, running: Iterable[Node] = ()
    ) -> None:
        """After an operation: frontier bookkeeping (per tree), then a threshold check.

        ``forced``: the operation appended a forced block. Appended to a child of the last expansion
        (a task's forced text after a sampled thought), it continues that expansion's frontier;
        appended anywhere else it starts a new one, like an expansion of its parent.
        ``running``: nodes whose rows are still decoding (other trees' work): their paths stay active.
        """
        if created:
            tree = created[0].tree_id
            leaves = {n.id for n in targets} | {n.id for n in created}
            sampled = self._sampled.get(tree, set())
            if forced and targets and all(t.id in sampled for t in targets):
                self._leaves[tree] = self._leaves.get(tree, set()) | leaves
            else:
                self._leaves[tree] = leaves
                self._sampled[tree] = set() if forced else {n.id for n in created}
        ends = [*targets, *created, *running]
        self.active = frozenset(path_ids(ends)) & frozenset(self.store.block_ids())
        if self.planner.over_threshold():
            self.emit(MemoryThreshold(self.store.resident_tokens, self.budget), self.planner.threshold_target())
        for node in created:
            if node.id in self.store:
                self.store.consolidate(node.id)

    def forget(self, node_ids: Sequence[int]) -> None:
        """Released blocks leave the active set and the frontier."""
        gone = set(node_ids)
        self.active = frozenset(self.active - gone)
        for tree in list(self._leaves):
            self._leaves[tree] -= gone
            if tree in gone:
                del self._leaves[tree]
                self._sampled.pop(tree, None)

    # ---- policy interaction --------------------------------------------------------------
    def emit(self, event: Event, target: int, pinned: dict[int, torch.Tensor] | None = None) -> None:
        """Deliver an event to the policy, carry out its plan, log the result (``pinned``: below
        the floor, what of the active path must stay; see :class:`MemoryView`)."""
        start = time.perf_counter()
        plan = self.policy.on_event(event, self.view(target, pinned))
        if plan is not None:
            plan.drop_host = plan.drop_host or self.planner.host_drops(plan, self.active)
        planned = time.perf_counter()
        self.seconds["plan"] += planned - start
        if plan or pinned:
            self.execute(plan or RetentionPlan(), pinned)
            self.seconds["evict"] += time.perf_counter() - planned
        logs = [self.events] if self.account is None else [self.events, self.account.events]
        for log in logs:
            log.add(
                event,
                self.step,
                self.store.resident_tokens,
                self.store.host_tokens,
                len(self.store.journal),
                len(plan or ()),
            )

    def view(self, target: int, pinned: dict[int, torch.Tensor] | None = None) -> MemoryView:
        """What the policy sees; its blocks are built only if it looks at them (:class:`LazyBlocks`)."""
        blocks = LazyBlocks(lambda: self._block_views(pinned is not None))
        return MemoryView(
            blocks=blocks,
            active=self.active,
            budget=self.budget,
            target=target,
            read=self._read,
            pinned=pinned,
            kv_shape=(self.store.shape.layers, self.store.shape.kv_heads),
        )

    def _block_views(self, hosted: bool) -> list[BlockView]:
        """Every live block's view, shared prefix blocks (negative ids) first, top down (the oldest tokens)."""
        order = sorted(self.store.block_ids(), key=lambda i: (i >= 0, self.store.get(i).start_pos if i < 0 else i))
        return [self._block_view(i, hosted) for i in order]

    def _block_view(self, block_id: int, hosted: bool) -> BlockView:
        """A block as the policy sees it; with ``hosted``, its host tokens too (active blocks below the floor)."""
        active = block_id in self.active
        view = BlockView(self.nodes[block_id], self.store.get(block_id), active)
        host = self.store.host.indices(block_id) if hosted and active else None
        return view if host is None else replace(view, hosted=host.cpu())

    def _read(self, block_id: int, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the K/V of a block's device ``tokens`` (N,): (L, H_kv, N, D) each."""
        return self.store.pool.read(self.store.get(block_id).slots_of(tokens))

    def execute(self, plan: RetentionPlan, pinned: dict[int, torch.Tensor] | None = None) -> None:
        """Carry out a policy's plan as the planner says (:meth:`MemoryPlanner.retention`): host spans
        dropped, evictions, then below the floor (``pinned`` given) the active path's host tokens in
        its residency brought back."""
        retention = self.planner.retention(plan, self.active, pinned)
        for block_id in retention.drop_host:
            self.store.drop_host(block_id)
        for block_id, keep, offload in retention.apply:
            heads = plan.heads.get(block_id)
            if heads is None:
                self.store.apply(block_id, keep, offload=offload)
            elif keep.numel() != heads.shape[-1]:  # the planner kept more than the plan (an active block)
                raise ValueError(f"block {block_id}: {keep.numel()} nominal tokens for {heads.shape[-1]} per head")
            else:
                self.store.apply_heads(block_id, keep, heads, offload=offload)
        if retention.path:
            self._bring_back(retention.path, pinned)

    def _bring_back(self, path: dict[int, torch.Tensor], pinned: dict[int, torch.Tensor]) -> None:
        """Restore the host tokens of ``path`` (block id -> its residency below the floor), pinned
        blocks first, into free slots; a block whose extra tokens do not fit gets its pinned ones only."""
        start = time.perf_counter()
        for block_id in sorted(path, key=lambda b: b not in pinned):
            blk = self.store.get(block_id)
            host = self.store.host.indices(block_id)
            if host is None:
                continue
            keep = path[block_id]
            if not self.planner.has_free(int(torch.isin(host.cpu(), keep).sum())):
                log.warning("below the floor: block %d's ranked tokens do not fit, its pinned ones come back", block_id)
                keep = union(blk.kept.cpu(), pinned.get(block_id))
            self._restore(block_id, union(blk.kept.cpu(), keep))
        self.seconds["restore"] += time.perf_counter() - start

    # ---- internals -----------------------------------------------------------------------
    def _restore(self, block_id: int, keep: torch.Tensor) -> None:
        """A block's residency grows to ``keep`` (every resident token in it: nothing leaves); its
        host tokens in ``keep`` come back."""
        self.store.apply(block_id, keep, offload=True)

    def _fit_below_floor(self, pinned: dict[int, torch.Tensor], need: int, ahead: int) -> None:
        """One MemoryThreshold below the floor: the policy's plan keeps the pinned tokens and, by value,
        as much more of the active path as leaves ``need`` (+ ``ahead``) slots; the inactive blocks go
        first. Its restores start copying before the next forward."""
        room = self.planner.room_plan(need, ahead, self.parked, self.active, below_floor=True)
        self._carry_out(room, pinned)
        self.store.prefetch()

    def _make_room(self, need: int, ahead: int) -> bool:
        """The planner's way to ``need`` free slots carried out (parked blocks out, one policy plan)."""
        self._carry_out(self.planner.room_plan(need, ahead, self.parked, self.active))
        return self.planner.has_free(need)

    def _carry_out(self, room: RoomPlan, pinned: dict[int, torch.Tensor] | None = None) -> None:
        if room.park:
            self._park()
        if room.ask:
            self.emit(MemoryThreshold(self.store.resident_tokens, self.budget, room.short), room.target, pinned)

    def _park(self) -> None:
        """Offload every resident token of the parked blocks (the waiting searches' trees) at once."""
        start, empty = time.perf_counter(), torch.zeros(0, dtype=torch.long)
        for block_id in self.parked - self.active:
            if block_id in self.store and self.store.get(block_id).kept_tokens:
                self.store.apply(block_id, empty, offload=True)
        self.parked = frozenset()
        self.seconds["evict"] += time.perf_counter() - start

    def _make_whole(self, ends: Sequence[Node]) -> None:
        """Restore the paths to ``ends`` from the host tier, top-down (what no tier holds is
        recomputed by the runner: the admission's ``recompute``)."""
        self._restore_whole(self._hosted(ends, self.active))

    def _hosted(self, ends: Sequence[Node], blocks: frozenset[int]) -> list[Node]:
        """Blocks of ``blocks`` on the paths to ``ends``, top-down, that are not whole and have host tokens."""
        nodes = ordered_path_nodes(ends, blocks)
        return [n for n in nodes if not self.store.get(n.id).whole and n.id in self.store.host]

    def _restore_whole(self, nodes: Sequence[Node]) -> None:
        """Every host token of ``nodes`` comes back (their copies queued for the next prefetch)."""
        start = time.perf_counter()
        for node in nodes:
            self._restore(node.id, torch.arange(self.store.get(node.id).length))
        self.seconds["restore"] += time.perf_counter() - start

    def _check_switch(self, targets: Sequence[Node]) -> None:
        """A BranchSwitch per tree whose targets leave that tree's frontier."""
        by_tree: dict[int, list[Node]] = {}
        for t in targets:
            by_tree.setdefault(t.tree_id, []).append(t)
        for tree, mine in by_tree.items():
            leaves = self._leaves.get(tree)
            if not leaves:
                continue
            switched = tuple(t.id for t in mine if not any(n.id in leaves for n in t.path()))
            if switched:
                self.emit(BranchSwitch(max(leaves), switched), self.planner.threshold_target())
