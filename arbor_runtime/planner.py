"""The memory planner: what fits the budget, computed from the store's bookkeeping alone.

Pure: it reads block sizes and residency (the store's records, the pool's count of used slots), the
:class:`MemoryConfig` it owns (budget, host budget, threshold, prefill chunk) and the policy's
:class:`~arbor_runtime.policies.base.Capabilities`, and moves no tensor; it never asks the policy for
a plan. It is the one place that compares anything against the budget (the pool's hard backstop in
kv/pool.py aside) and the one place that reads a policy's capabilities: the scheduler asks it what to
admit, grow or chunk; the memory manager asks it how room is made and what carrying out a plan does
to the store; the runner and the engine ask it whether a forward records attention statistics; the
CLI asks it whether a budget can serve a problem at all.

The floor. A policy that keeps the active path whole needs, for a lone row, its whole path plus its
new tokens on the device. Below that, a policy that ``degrades`` (arbor) keeps running: the planner
decides what of the path stays whatever its value (:meth:`MemoryPlanner.pinned`: as room allows,
the root's sinks, the frontier block, the prompt outside its few-shot examples, the frontier's
parent), and the policy ranks the rest. Only a row whose own new tokens do not fit is an OOM: what
no policy could run with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from arbor_runtime.errors import KVBudgetExceeded
from arbor_runtime.plans import AdmitPlan, Retention, RoomPlan
from arbor_runtime.policies.base import PIN_PARTS
from arbor_runtime.tree import PROMPT, Entry, demand_tokens, ordered_path_nodes, path_ids

if TYPE_CHECKING:
    from arbor_runtime.kv import KVStore
    from arbor_runtime.policies.base import Capabilities, RetentionPlan
    from arbor_runtime.tree import Node

#: free slots without a budget
UNBOUNDED = 1 << 62


class Declares(Protocol):
    """What the planner reads of a policy: its capabilities (nothing else; it never asks for a plan)."""

    @property
    def capabilities(self) -> Capabilities: ...


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """The memory settings, owned by the planner (the user sets them with the policy, the runtime
    reads them off it once, :meth:`of`).

    Attributes:
        budget_tokens: the KV budget in device tokens (None: no budget).
        kv_budget_tokens: device pool slots: the budget less what the policy reserves for itself (a
            sparse attention index, in pool-equivalent tokens); the budget when it reserves nothing.
        host_budget_tokens: host tier tokens at most (None: unbounded).
        threshold: a MemoryThreshold fires when resident blocks pass ``threshold`` x the pool after
            an operation; the policy's plan then aims at that level.
        prefill_chunk: tokens per chunk when a block is prefilled in chunks (None: a quarter of the
            pool, 512 without a budget).
    """

    budget_tokens: int | None = None
    kv_budget_tokens: int | None = None
    host_budget_tokens: int | None = None
    threshold: float = 0.9
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        if self.kv_budget_tokens is None and self.budget_tokens is not None:
            object.__setattr__(self, "kv_budget_tokens", self.budget_tokens)
        if (self.budget_tokens is None) != (self.kv_budget_tokens is None):
            raise ValueError(f"kv_budget_tokens={self.kv_budget_tokens} needs budget_tokens (got None)")
        if self.budget_tokens is not None and not 0 < self.kv_budget_tokens <= self.budget_tokens:
            raise ValueError(f"kv_budget_tokens={self.kv_budget_tokens} must be in 1..{self.budget_tokens}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold} must be in (0, 1]")

    @classmethod
    def of(cls, policy) -> MemoryConfig:
        """The settings a built policy carries (its fields were validated when it was built)."""
        host = getattr(policy, "host_budget_tokens", None)
        return cls(policy.budget_tokens, policy.kv_budget_tokens, host, policy.threshold, policy.prefill_chunk)

    @property
    def chunk_tokens(self) -> int:
        """Tokens per prefill chunk when a block must be prefilled in chunks."""
        if self.prefill_chunk is not None:
            return self.prefill_chunk
        return max(1, (self.kv_budget_tokens or 2048) // 4)


class MemoryPlanner:
    """Admission, room and statistics arithmetic over one store, one config, one policy's capabilities.

    Args:
        store: the block store (read only: block lengths, kept tokens, the pool's used slots).
        policy: read for its ``capabilities`` only (never asked to plan).
        config: the memory settings (default: none, no budget).
    """

    def __init__(self, store: KVStore, policy: Declares, config: MemoryConfig | None = None) -> None:
        self.store, self.policy, self.config = store, policy, config or MemoryConfig()
        #: the largest lone need of any forward so far (:meth:`lone_need`): the least budget at which
        #: every operation of the run would have fit whole (``RuntimeMetrics.floor_tokens``)
        self.largest_lone_need = 0

    @property
    def caps(self) -> Capabilities:
        return self.policy.capabilities

    @property
    def budget(self) -> int | None:
        """Device pool slots (the budget less a sparse index's reserve)."""
        return self.config.kv_budget_tokens

    @property
    def free(self) -> int:
        """Pool slots not in use (unbounded without a budget)."""
        return UNBOUNDED if self.budget is None else self.budget - self.store.pool.used

    @property
    def used(self) -> int:
        """Pool slots in use: resident block tokens plus slots held by rows in flight."""
        return self.store.pool.used

    @property
    def in_flight(self) -> int:
        """Pool slots held by rows in flight (not by stored blocks)."""
        return self.store.pool.used - self.store.resident_tokens

    @property
    def degrades(self) -> bool:
        """A lone row that cannot fit whole goes below the floor (instead of failing)."""
        return self.caps.degrades

    def exceeded(self, needed: int, where: str = "") -> KVBudgetExceeded:
        """The OOM of work that needs ``needed`` slots alone (it names the user's budget)."""
        return KVBudgetExceeded(needed, self.config.budget_tokens, where)

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
        active = frozenset(i for i in active if i in self.store)
        recompute = tuple(self.recompute([n for n, _ in queue[:rows]], active)) if whole else ()
        return AdmitPlan(rows, need, active, whole, recompute=recompute)

    def work_admission(self, node: Node, slots: int, running: Sequence[Node], prefill: bool) -> tuple[AdmitPlan, int]:
        """(plan, slots admitted) for one prefill or choose pass at ``node`` needing ``slots``: first
        with its path kept as it is; else, under a policy that prefills in chunks (it may shrink the
        active path, or degrades below its floor), as a lone entry, a ``prefill`` cut to the
        configured chunk."""
        plan = self.admission([(node, slots)], running, shrink_active=False)
        if plan.rows or not chunks_prompts(self.caps):
            return plan, slots
        if prefill:
            slots = min(slots, self.config.chunk_tokens)
        return self.admission([(node, slots)], running), slots

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

    def recompute(self, ends: Sequence[Node], active: frozenset[int]) -> list[Node]:
        """Blocks of the ``active`` paths to ``ends`` with tokens no tier holds, parents first: what
        making those paths whole must rebuild (their host tokens are restored)."""
        return [n for n in ordered_path_nodes(ends, active) if self.store.dropped(n.id)]

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
        """The parts of :meth:`pinned` the policy keeps in its ``pins`` (block id -> held block-local tokens)
        over ``ends``, in :data:`~arbor_runtime.policies.base.PIN_PARTS` order."""
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
        parts = dict(zip(PIN_PARTS, (sinks, frontier, prompt, parent), strict=True))
        return [self._held(parts[name]) for name in PIN_PARTS if name in self.caps.pins]

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

    # ---- search-level admission -------------------------------------------------------------
    def holds(self, entries: Iterable[Entry]) -> bool:
        """Does the budget hold this work at once (every path whole, and each entry's slots)?"""
        return fits_together(entries, self.budget)

    # ---- room now ------------------------------------------------------------------------
    def has_free(self, need: int, reserve: int = 0) -> bool:
        """Are ``need`` slots free now, ``reserve`` more kept aside?"""
        return self.free - reserve >= need

    def room_plan(
        self, need: int, ahead: int, parked: frozenset[int], active: frozenset[int], below_floor: bool = False
    ) -> RoomPlan:
        """How ``need`` free slots are made now, ``ahead`` more asked of a policy's plan (see
        :meth:`room_target`): nothing when they are free; else, under a policy that offloads, the
        ``parked`` blocks (of searches waiting for their turn; the ``active`` ones stay) go to the
        host tier in one go, and when that is not enough a policy that frees memory is asked for a
        plan. ``below_floor``: a lone row's path is token-extracted (the parked blocks go, and the
        policy is always asked: its plan decides the path's residency)."""
        if self.has_free(need) and not below_floor:
            return RoomPlan()
        park = bool(parked) and self.caps.offload
        freed = sum(self.store.get(i).kept_tokens for i in parked - active if i in self.store) if park else 0
        if below_floor:
            target = self.room_target(need, ahead)
            return RoomPlan(park, True, target, max(self.store.resident_tokens - freed - target, 0))
        if park and self.has_free(need - freed):
            return RoomPlan(park=True)
        if not self.caps.frees_memory:
            return RoomPlan(park)
        return RoomPlan(park, True, self.room_target(need, ahead), need - self.free - freed)

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

    def prefetches(self, work: Sequence[Entry], missing: int, reserve: int) -> bool:
        """Does a new expansion's path come back from the host as soon as it is chosen (at its
        :meth:`MemoryManager.begin`, before the scheduler admits its rows)? Under a policy that
        offloads and restores the active path whole, when the ``missing`` host tokens fit in free
        slots now, keeping ``reserve`` free for the running rows, and every entry of ``work`` (path
        end, its thought) fits the budget alone: below the floor the admission token-extracts the path
        instead, and bringing all of it back first would be copied for nothing."""
        caps = self.caps
        if not (caps.offload and caps.restores_active_path) or missing <= 0 or not self.has_free(missing, reserve):
            return False
        return self.budget is None or all(demand_tokens([entry]) <= self.budget for entry in work)

    # ---- thresholds ----------------------------------------------------------------------
    def threshold_target(self) -> int:
        """Resident block tokens a plan answering an event aims at: ``threshold`` x the pool."""
        return int(self.config.threshold * self.budget) if self.budget is not None else UNBOUNDED

    def over_threshold(self) -> bool:
        """Do resident blocks pass the threshold (a MemoryThreshold after an operation)?"""
        return self.budget is not None and self.store.resident_tokens > self.threshold_target()

    # ---- carrying out a policy's plan ---------------------------------------------------------
    def retention(
        self, plan: RetentionPlan, active: frozenset[int], pinned: dict[int, torch.Tensor] | None
    ) -> Retention:
        """What the store does with a policy's plan. Evictions only (restores are the manager's own
        decision): active blocks are never shrunk under a policy that keeps them whole, unless below
        the floor (``pinned`` given): there the plan's ``keep`` of an active block, with its pinned
        tokens, is its residency, and its host tokens in it come back (``path``). Host spans the
        plan drops go first (never an active block's), and those blocks' evicted tokens are dropped
        too: the host tier never holds more than its capacity, even for a moment. Evicted tokens go
        to the host under a policy that offloads."""
        out = Retention(drop_host=[i for i in plan.drop_host if i not in active])
        for block_id, keep in plan.keep.items():
            keep = keep.cpu()
            if self.caps.keep_active_whole and block_id in active:
                if pinned is None:
                    continue
                keep = out.path[block_id] = union(keep, pinned.get(block_id))
            kept = self.store.get(block_id).kept
            offload = self.caps.offload and block_id not in out.drop_host
            out.apply.append((block_id, kept[torch.isin(kept, keep)], offload))
        for block_id, idx in (pinned or {}).items():
            if block_id not in out.path and block_id in self.store:
                out.path[block_id] = union(self.store.get(block_id).kept.cpu(), idx)
        return out

    def host_drops(self, plan: RetentionPlan, active: frozenset[int]) -> list[int]:
        """Blocks whose host spans go so the host tier stays under its cap once ``plan`` is carried
        out, taken in the plan's ``host_order`` (lowest value first; the policy ranks, the planner
        decides how many): a block's load is its tokens off the device plus those the plan moves
        off; active blocks and empty ones are skipped. None without a cap or an order."""
        cap = self.config.host_budget_tokens
        if cap is None or plan.host_order is None:
            return []
        kept = {i: self.store.get(i).kept_tokens for i in self.store.block_ids()}
        moved = {i: kept[i] - int(keep.numel()) for i, keep in plan.keep.items() if i in kept}
        load = {i: self.store.get(i).length - kept[i] + moved.get(i, 0) for i in kept}
        total, drop = sum(load.values()), []
        for block_id in plan.host_order:
            if total <= cap:
                break
            if load.get(block_id) and block_id not in active:
                drop.append(block_id)
                total -= load[block_id]
        return drop

    # ---- attention statistics ---------------------------------------------------------------
    def head_statistics(self) -> bool:
        """Are attention statistics kept per layer and KV head too (``KVStore.head_stats``)? For a policy
        that ranks by them and keeps tokens per (layer, KV head) (``policy.granularity=head``)."""
        return self.caps.needs_attention and getattr(self.policy, "granularity", "token") == "head"

    def records_statistics(self, work: Sequence[Entry]) -> bool:
        """Does a forward serving ``work`` ((path end or None, slots it may add) per row or block)
        record attention statistics? Always for a policy that needs them and does not say
        ``stats_on_pressure``. For one that does (arbor), only with a budget and when the work is
        within one operation of its floor: some entry's whole path plus its slots, plus as many
        slots again (the next operation of its size: the child's expansion), reach the budget.

        Why that horizon: above its floor arbor rebuilds full's tree whatever tokens its plans keep
        on the device (every evicted token of a path comes back before the path is read), so the
        statistics change only which tokens wait on the host, never a token of the tree. They are
        needed where the active path itself will be token-extracted (:meth:`below_floor`), and that
        happens only to work whose lone need (its path plus its slots) exceeds the budget; one
        operation ahead, the path's blocks have been observed by at least one thought's queries
        (SnapKV's observation window is 32) when the plan that reads them comes. Until then the
        statistics pass (a second ``QK^T`` per layer) is not run; an inactive block nobody scored
        keeps its newest tokens (:func:`~arbor_runtime.policies.arbor._token_values`)."""
        lone = self.lone_need(work)
        caps = self.caps
        if not caps.needs_attention or caps.observation_window:
            return bool(caps.needs_attention)
        if not caps.stats_on_pressure:
            return True
        if self.budget is None or not work:
            return False
        return lone + max(slots for _, slots in work) >= self.budget

    def lone_need(self, work: Sequence[Entry]) -> int:
        """The most slots one entry of a forward's ``work`` needs alone: its whole path plus its slots
        (a decode row's whole thought, a prefill's block, a choose pass's kept choices). Every forward
        asks (through :meth:`records_statistics`), so the run's largest is kept: a budget of at least
        that runs every operation of the same search whole (arbor's exact zone)."""
        lone = max((demand_tokens([entry]) for entry in work), default=0)
        self.largest_lone_need = max(self.largest_lone_need, lone)
        return lone

    def decode_statistics(self, work: Sequence[Entry]) -> bool:
        """Does a decode step of rows ``work`` ((owner, max new tokens) each) record attention
        statistics (:meth:`records_statistics`)? Never under an observation window: a window scores
        prefills only."""
        return self.records_statistics(work) and not self.caps.observation_window

    def prefill_statistics(self, count: int, work: Sequence[Entry]) -> tuple[bool, int]:
        """(record, from which query) for a prefill-style forward of ``count`` new tokens serving
        ``work`` (:meth:`records_statistics`): under an observation window only its last queries count."""
        window = self.caps.observation_window
        return self.records_statistics(work), max(0, count - window) if window else 0

    @property
    def windowed(self) -> bool:
        """Attention statistics come from an observation window: a new record replaces the old one
        of every token it saw (SnapKV), instead of adding to it."""
        return bool(self.caps.observation_window)

    # ---- refusals before any work --------------------------------------------------------------
    def refuses_prompt(self, tokens: int) -> bool:
        """Could a root prompt of ``tokens`` never be prefilled? Only when it is larger than the budget
        and the policy can neither shrink the active path nor degrade below its floor (then it is
        prefilled in chunks). Against the user's budget, not the pool: a sparse index's reserve is not
        counted here (as before issue 48; the CLI's check and the admissions count it)."""
        budget = self.config.budget_tokens
        return budget is not None and tokens > budget and not chunks_prompts(self.caps)

    def keeps_none_of_prompt(self, tokens: int, page: int) -> bool:
        """Would a root prompt of ``tokens`` larger than the budget keep none of itself beside a decoding
        row's first ``page`` slots (a budget under ``page + 1``)? Then it is refused, not dropped whole."""
        budget = self.config.budget_tokens
        return budget is not None and tokens > budget and budget < page + 1


# ---- pure functions of a budget (no store: the CLI checks a budget before any runtime) -------------
def fits_together(entries: Iterable[Entry], budget: int | None) -> bool:
    """Does work needing ``entries`` fit ``budget`` device slots at once (None: no budget, always)?"""
    return budget is None or demand_tokens(entries) <= budget


def chunks_prompts(caps: Capabilities) -> bool:
    """A prompt larger than the room left is prefilled in chunks: under a policy that may shrink the
    active path, or one that degrades below its floor."""
    return bool(caps.shrinks_active_path or caps.degrades)


@dataclass(frozen=True, slots=True)
class Opening:
    """What a problem's first operation asks of a budget (:func:`opening`).

    Attributes:
        need: the least pool slots: the prompt (one token when it is prefilled in chunks) plus one thought.
        chunked: the prompt may be prefilled in chunks.
        fits: the pool holds ``need`` (else the problem can never start).
    """

    need: int
    chunked: bool
    fits: bool


def opening(policy: Declares, kv_budget: int | None, prompt: Callable[[], int], thought: int) -> Opening | None:
    """The first operation of a problem whose prompt has ``prompt()`` tokens (asked only when it
    matters) and whose thoughts have at most ``thought``, under ``policy`` with ``kv_budget`` pool
    slots (None: no budget, nothing to check)."""
    if kv_budget is None:
        return None
    chunked = chunks_prompts(policy.capabilities)
    need = (1 if chunked else prompt()) + thought
    return Opening(need, chunked, kv_budget >= need)


def below_exact_floor(policy: Declares, kv_budget: int | None, prompt: Callable[[], int], thought: int) -> bool:
    """Does a policy that degrades run lossy on a problem whose prompt has ``prompt()`` tokens (asked
    only when it matters): are ``kv_budget`` pool slots fewer than the prompt plus one thought (the
    exact floor; deeper paths raise it)? False without a budget or for a policy that does not degrade."""
    if kv_budget is None or not policy.capabilities.degrades:
        return False
    return kv_budget < prompt() + thought


def manages_memory(policy: Declares) -> bool:
    """Can the policy run under a budget at all (its plans free device memory)? ``full`` cannot: any
    budget it passes is an OOM."""
    return policy.capabilities.frees_memory


def least_budget(need: int, reserve_share: float) -> int:
    """The least budget that leaves ``need`` pool slots after a reserve of ``ceil(share x budget)``."""
    budget = need
    while budget - math.ceil(reserve_share * budget) < need:
        budget += 1
    return budget


# ---- index sets --------------------------------------------------------------------------
def union(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Sorted union of two index sets (``b`` None: ``a`` sorted)."""
    return torch.unique(a if b is None else torch.cat([a, b.cpu()]))
