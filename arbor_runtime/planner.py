"""The memory planner: what fits the budget, computed from the store's bookkeeping alone.

Pure: it reads block sizes and residency (the store's records, the pool's count of used slots)
and the policy's :class:`~arbor_runtime.policies.base.Capabilities` and budget, and moves no
tensor; it never asks the policy for a plan. Every comparison against the budget is made here
(the pool's hard backstop in kv/pool.py aside): the scheduler asks it what to admit, the memory
manager asks it whether a plan is needed and how much room to ask for, then carries the plan out.

The floor. A policy that keeps the active path whole needs, for a lone row, its whole path plus its
new tokens on the device. Below that, a policy that ``degrades`` (arbor) keeps running: the planner
decides what of the path stays whatever its value (:meth:`MemoryPlanner.pinned`: as room allows,
the root's sinks, the frontier block, the prompt outside its few-shot examples, the frontier's
parent), and the policy ranks the rest. Only a row whose own new tokens do not fit is an OOM: what
no policy could run with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from arbor_runtime.tree import PROMPT

if TYPE_CHECKING:
    from arbor_runtime.kv import KVStore
    from arbor_runtime.policies.base import Capabilities, Policy
    from arbor_runtime.tree import Node

#: free slots without a budget
UNBOUNDED = 1 << 62


@dataclass(frozen=True, slots=True)
class AdmitPlan:
    """An admission decided, not yet carried out.

    Attributes:
        rows: how many entries of the queue's head start now (0: none fits).
        need: slots they need now: their own slots, plus, when ``whole``, the evicted tokens of
            their paths (restored from the host tier or recomputed).
        active: block ids (in the store) of the running and admitted paths.
        whole: the admitted paths are made whole before they run.
        pinned: below the floor (a lone row whose path does not fit whole), block id -> block-local
            tokens of its path that stay on the device (:meth:`MemoryPlanner.pinned`); the policy
            ranks the rest of the path. None: at or above the floor.
    """

    rows: int = 0
    need: int = 0
    active: frozenset[int] = field(default_factory=frozenset)
    whole: bool = False
    pinned: dict[int, torch.Tensor] | None = None


class MemoryPlanner:
    """Admission and room arithmetic over one store under one policy's capabilities and budget.

    Args:
        store: the block store (read only: block lengths, kept tokens, the pool's used slots).
        policy: read for its ``capabilities`` and ``kv_budget_tokens`` only (never asked to plan).
    """

    def __init__(self, store: KVStore, policy: Policy) -> None:
        self.store, self.policy = store, policy

    @property
    def caps(self) -> Capabilities:
        return self.policy.capabilities

    @property
    def budget(self) -> int | None:
        """Device pool slots (the budget less a sparse index's reserve)."""
        return self.policy.kv_budget_tokens

    @property
    def free(self) -> int:
        """Pool slots not in use (unbounded without a budget)."""
        return UNBOUNDED if self.budget is None else self.budget - self.store.pool.used

    @property
    def in_flight(self) -> int:
        """Pool slots held by rows in flight (not by stored blocks)."""
        return self.store.pool.used - self.store.resident_tokens

    # ---- admission -----------------------------------------------------------------------
    def admission(
        self,
        queue: Sequence[tuple[Node, int]],
        running: Iterable[Node],
        shrink_active: bool = True,
        finish: Sequence[int] | None = None,
    ) -> AdmitPlan:
        """How many of ``queue`` (path end, slots needed) can start next to the ``running`` paths.

        Rows are taken in queue order while the room they need (slots, plus the evicted tokens of
        their paths under ``keep_active_whole``) fits the budget once everything the policy may
        evict is gone: inactive blocks, and, for a lone row under a policy that may shrink the
        active path, that path too (unless ``shrink_active`` is False). A policy that keeps the
        active path but does not restore it first (a sparse policy's ``rehydrate=ranked``) gets
        whole paths when that admits as many rows, each able to grow to ``finish`` slots (default:
        its first slots), as leaving the paths' evicted spans on the host would, else the latter.
        A lone head that does not fit whole under a policy that ``degrades`` is admitted below the
        floor when its pinned tokens and slots fit (:meth:`below_floor`).
        """
        base = path_ids(running)
        lone = shrink_active and not base
        whole = self.caps.keep_active_whole
        rows, need, active = self._count(queue, base, lone, count_missing=whole)
        if whole and not self.caps.restores_active_path:
            grown = queue if finish is None else [(n, max(s, f)) for (n, s), f in zip(queue, finish, strict=True)]
            partial = self._count(queue, base, lone, count_missing=False)
            if partial[0] > self._count(grown, base, lone, count_missing=True)[0]:
                (rows, need, active), whole = partial, False
        if rows == 0:
            return self.below_floor(*queue[0]) if lone and queue else AdmitPlan()
        return AdmitPlan(rows, need, frozenset(i for i in active if i in self.store), whole)

    def below_floor(self, end: Node, slots: int) -> AdmitPlan:
        """One row at ``end`` with ``slots`` new slots, below the floor: admitted with the tokens of
        its path that must stay (:meth:`pinned`) when the policy ``degrades`` and they fit."""
        if not self.caps.degrades:
            return AdmitPlan()
        pinned = self.pinned([end], slots)
        if pinned is None:
            return AdmitPlan()
        active = frozenset(i for i in path_ids([end]) if i in self.store)
        return AdmitPlan(1, slots, active, whole=False, pinned=pinned)

    # ---- below the floor ------------------------------------------------------------------
    def pinned(self, ends: Sequence[Node], need: int) -> dict[int, torch.Tensor] | None:
        """The block-local tokens of the paths to ``ends`` that stay on the device below the floor,
        next to ``need`` new slots; None when not even the ``need`` slots fit.

        Parts, in order, each taken whole while the room left (the budget less the slots of rows
        in flight and ``need``) holds it, else skipped: 1. the root's first ``sink_tokens``; 2. the
        frontier block (the nearest block below the prompt on each path, whole); 3. the prompt
        outside its few-shot examples (``Node.examples``: instruction, question); 4. the frontier's
        parent (whole). None is required: like a tree-blind policy, a lone row runs while its own
        new tokens fit (the policy then keeps what of the path it values most). Only tokens some
        tier holds count (on the device or the host); tokens dropped from every tier are not
        brought back below the floor.
        """
        if self.budget is None:
            return {}
        room = self.budget - self.in_flight - need
        if room < 0:
            return None
        chosen: dict[int, torch.Tensor] = {}
        total = 0
        for part in self._parts(ends):
            part = {b: idx[~torch.isin(idx, chosen[b])] if b in chosen else idx for b, idx in part.items()}
            size = sum(int(idx.numel()) for idx in part.values())
            if total + size > room:
                continue
            for b, idx in part.items():
                chosen[b] = torch.sort(torch.cat([chosen[b], idx]) if b in chosen else idx).values
            total += size
        return chosen

    def _parts(self, ends: Sequence[Node]) -> list[dict[int, torch.Tensor]]:
        """The four parts of :meth:`pinned` (block id -> held block-local tokens) over ``ends``."""
        sinks, frontier, prompt, parent = {}, {}, {}, {}
        for end in ends:
            path = [n for n in end.kv_path() if n.id in self.store]
            span = end.path()[0].examples
            for node in path:
                if node.kind != PROMPT:
                    continue
                blk = self.store.get(node.id)
                pos = torch.arange(node.start_pos, node.start_pos + blk.length)
                sinks[node.id] = torch.nonzero(pos < self.caps.sink_tokens).squeeze(1)
                if span is not None:
                    prompt[node.id] = torch.nonzero((pos < span[0]) | (pos >= span[1])).squeeze(1)
            below = [n for n in reversed(path) if n.kind != PROMPT]
            for part, node in zip((frontier, parent), below[:2], strict=False):
                part[node.id] = torch.arange(self.store.get(node.id).length)
        return [self._held(p) for p in (sinks, frontier, prompt, parent)]

    def _held(self, part: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """``part`` less the tokens no tier holds (dropped for good), empty entries left out."""
        out = {}
        for block_id, idx in part.items():
            blk = self.store.get(block_id)
            host = self.store.host.indices(block_id)
            held = blk.kept.cpu() if host is None else torch.cat([blk.kept.cpu(), host.cpu()])
            idx = idx[torch.isin(idx, held)]
            if idx.numel():
                out[block_id] = idx
        return out

    def _count(
        self, queue: Sequence[tuple[Node, int]], base: set[int], lone: bool, count_missing: bool
    ) -> tuple[int, int, set[int]]:
        """(rows, slots needed, active block ids) of the queue's head that fit, in order; with
        ``count_missing`` each new path's evicted tokens count too (it is made whole), and so do the
        running paths' (none at or above the floor; a row running below it holds a partial path,
        which a row joining it would make whole)."""
        active, rows = set(base), 0
        need = self.missing(base) if count_missing else 0
        for i, (node, slots) in enumerate(queue):
            path = path_ids([node])
            extra = slots + (self.missing(path - active) if count_missing else 0)
            if not self.fits(active | path, need + extra, lone=lone and i == 0):
                break
            active |= path
            need += extra
            rows += 1
        return rows, need, active

    def fits(self, active: set[int], need: int, lone: bool) -> bool:
        """Would ``need`` more slots fit once the policy evicted all it may (inactive blocks; for a
        policy that may shrink the active path, everything when this is a ``lone`` row)?"""
        return self.budget is None or self.room(active, lone) >= need

    def room(self, active: set[int], lone: bool) -> int:
        """Free slots once the policy evicted all it may next to the ``active`` blocks (see :meth:`fits`)."""
        if not self.caps.frees_memory:
            return self.free
        may_shrink_active = lone and not self.caps.keep_active_whole
        evictable = sum(
            self.store.get(i).kept_tokens for i in self.store.block_ids() if may_shrink_active or i not in active
        )
        return self.free + evictable

    def missing(self, block_ids: Iterable[int]) -> int:
        """Tokens of these blocks not on the device (what making them whole costs)."""
        if not self.caps.keep_active_whole:
            return 0
        total = 0
        for i in block_ids:
            if i in self.store:
                blk = self.store.get(i)
                total += blk.length - blk.kept_tokens
        return total

    # ---- attention statistics ---------------------------------------------------------------
    def records_statistics(self, reach: int) -> bool:
        """Does a forward record attention statistics, when the work it serves may add ``reach`` more
        slots? Always for a policy that needs them and does not say ``stats_on_pressure``; for one that
        does, only with a budget and when the slots in use, this work's ``reach`` and as much again
        (the next operation of its size) would pass the threshold at which the policy plans: its plans
        come no sooner, and until then the statistics pass (a second ``QK^T`` per layer) is not run."""
        caps = self.caps
        if not caps.needs_attention or caps.observation_window:
            return bool(caps.needs_attention)
        if not caps.stats_on_pressure:
            return True
        if self.budget is None:
            return False
        return self.store.pool.used + 2 * reach >= self.policy.threshold * self.budget

    # ---- room now ------------------------------------------------------------------------
    def has_free(self, need: int, reserve: int = 0) -> bool:
        """Are ``need`` slots free now, ``reserve`` more kept aside?"""
        return self.free - reserve >= need

    def room_target(self, need: int, ahead: int) -> int:
        """Resident block tokens a policy's plan must get down to for ``need`` free slots now, and
        ``ahead`` more (at most an eighth of the budget, so a tight budget is not emptied for tokens
        that may never come). Slots held by rows in flight are not the policy's to free."""
        ahead = min(ahead, self.budget // 8)
        return self.budget - self.in_flight - need - ahead

    def ranked_room(self, total: int, active: set[int], reserve: int) -> int:
        """Free slots to ask the policy for before ranked restores of ``total`` tokens into the
        ``active`` paths, keeping ``reserve`` free: as many as the restores could take (0: no plan
        needed)."""
        want = min(total, self.room(active, lone=False) - reserve)
        return 0 if self.has_free(want, reserve) else want + reserve


def path_ids(ends: Iterable[Node]) -> set[int]:
    """Ids of every block on the KV paths to ``ends`` (root to end inclusive, shared prefix blocks too)."""
    return {n.id for end in ends for n in end.kv_path()}
