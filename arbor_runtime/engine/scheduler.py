"""The scheduler: the one place that decides what runs, what waits and what gives way.

Every piece of work that needs device room is admitted here the same way, by :meth:`Scheduler.admit`:
the rows of an expansion, a prefill (whole, or a chunk under a policy that may shrink the active
path), a choose pass. The pure :class:`~arbor_runtime.planner.MemoryPlanner` says what fits; the
memory manager carries the admission out (evictions, restores); the answer is to run (how many
rows, how many tokens, what to recompute first), to wait (rows in flight will free room), or to
fail (it cannot fit even alone: :class:`~arbor_runtime.errors.KVBudgetExceeded` naming need and
budget).

For the decode loop the scheduler holds the ``waiting`` and ``running`` rows (nano-vllm's
``Scheduler``) and plans each engine step in two halves, each carried out by the engine before the
next is decided, since each reads the pool the previous one left (planning both first would change
which rows fit):

    schedule() -> StepPlan.admitted, .recompute   (engine: recompute, first pages, first tokens)
    grow(plan) -> StepPlan.grown, .preempted      (engine: the pages)

Above rows, whole searches take turns when the budget cannot hold every search's active path
(:class:`~arbor_runtime.engine.turns.Turns`, updated by the engine once a cycle): only admitted
searches' rows start and their prefills and choose passes are admitted; the others wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from arbor_runtime.engine.turns import Turns
from arbor_runtime.errors import KVBudgetExceeded, NotYet

if TYPE_CHECKING:
    import torch

    from arbor_runtime.generation import Row
    from arbor_runtime.memory import MemoryManager
    from arbor_runtime.policies.base import Policy
    from arbor_runtime.tree import Node

#: pool slots a generating row is given at a time (like a KV page): its first PAGE tokens at
#: admission, then PAGE more whenever it fills them
PAGE = 8

#: what is being admitted: an expansion's rows, a prefill (chunked when it must be), a choose pass
KINDS = ("expand", "prefill", "choose")


@dataclass(slots=True)
class Admitted:
    """The scheduler's answer for a queue (run / wait / fail).

    Attributes:
        head: node id of the queue's first entry.
        rows: queue entries that start now (0: none; they wait, or fail when ``error`` is set).
        slots: slots the first entry was admitted with (a prefill's chunk may be fewer than asked).
        recompute: blocks dropped from every tier to rebuild, parents first, before the rows run.
        error: set when the first entry cannot fit even alone.
    """

    head: int
    rows: int = 0
    slots: int = 0
    recompute: list[Node] = field(default_factory=list)
    error: KVBudgetExceeded | None = None

    @property
    def wait(self) -> bool:
        """Nothing starts now, but rows in flight will free room."""
        return self.rows == 0 and self.error is None

    def required(self) -> Admitted:
        """This admission when something starts; else raise the error, or :class:`NotYet` (the work
        goes back to the engine's queue and is tried again next cycle). The one place work waits."""
        if self.error is not None:
            raise self.error
        if self.wait:
            raise NotYet(self.head)
        return self


@dataclass(slots=True)
class StepPlan:
    """What one decode step does about memory (see the module docstring for who carries out what).

    Attributes:
        admitted: rows that start this step (moved from waiting to running), in queue order.
        recompute: blocks to rebuild before they run; job: whose account the admission counts to.
        grown: (row, slots) for rows that filled their slots.
        preempted: rows sent back to waiting to make that room (they restart from their first token).
        waited: (row, seconds it waited) for the admitted rows; thrown: decode tokens each
            preempted row threw away (in ``preempted`` order).
    """

    admitted: list[Row] = field(default_factory=list)
    recompute: list[Node] = field(default_factory=list)
    job: object = None
    grown: list[tuple[Row, int]] = field(default_factory=list)
    preempted: list[Row] = field(default_factory=list)
    waited: list[tuple[Row, float]] = field(default_factory=list)
    thrown: list[int] = field(default_factory=list)


class Scheduler:
    """Decides every admission, growth and preemption over one memory manager.

    Args:
        memory: the memory manager (its planner decides what fits; it carries admissions out).
        policy: the retention policy (its capabilities, budget and prefill chunk).
        accounting: ``accounting(work)`` -> a context attributing store movements and events to it.
        fail: ``fail(job, error)`` ends an expansion that cannot run (the engine's, carried out at once).
        current: ``current()`` -> the account of the work being carried out (its search's turn
            decides whether a prefill or choose pass is admitted).
    """

    def __init__(
        self,
        memory: MemoryManager,
        policy: Policy,
        accounting: Callable[[object], AbstractContextManager[None]],
        fail: Callable[[object, BaseException], None],
        current: Callable[[], object] = lambda: None,
    ) -> None:
        self.memory, self.planner, self.policy = memory, memory.planner, policy
        self.accounting, self.fail, self.current = accounting, fail, current
        self.waiting: list[Row] = []
        self.running: list[Row] = []
        #: which searches may start work (the engine updates it every cycle)
        self.turns = Turns()

    def enqueue(self, rows: Sequence[Row]) -> None:
        """New rows wait for admission, after those already waiting."""
        now = time.perf_counter()
        for row in rows:
            row.queued_at = now
        self.waiting.extend(rows)

    def owners(self) -> list[Node]:
        """The nodes whose rows are decoding now (their paths are active)."""
        return [r.owner for r in self.running]

    # ---- the one admission ---------------------------------------------------------------
    def admit(
        self,
        queue: Sequence[tuple[Node, int]],
        running: Sequence[Node],
        kind: str,
        finish: Sequence[int] | None = None,
    ) -> Admitted:
        """Admit the head of ``queue`` (path end, slots) next to the ``running`` paths, and carry it out.

        ``expand``: as many rows as fit in order (a lone row may count on the policy shrinking its
        path), each able to grow to ``finish`` slots. ``prefill`` / ``choose``: one entry, first
        with its path kept as it is; under a policy that may shrink the active path, then as a lone
        entry, a prefill cut to the policy's chunk. Nothing fits: wait while rows are running, else
        fail naming what was needed. A prefill or choose pass of a search that does not have the
        turn waits (its rows were held back in :meth:`schedule`).
        """
        head, slots = queue[0]
        if kind != "expand" and not self.turns.admits(self.current()):
            return Admitted(head.id, slots=slots)
        if kind == "expand":
            plan = self.planner.admission(queue, running, finish=finish)
        else:
            plan = self.planner.admission(queue, running, shrink_active=False)
            caps = self.policy.capabilities
            if not plan.rows and (caps.shrinks_active_path or caps.degrades):  # a lone entry (below the floor)
                if kind == "prefill":
                    slots = min(slots, self.policy.chunk_tokens())
                    queue = [(head, slots)]
                plan = self.planner.admission(queue, running)
        if plan.rows:
            got = self.memory.admit(plan, [n for n, _ in queue[: plan.rows]])
            return Admitted(head.id, got.rows, slots, got.recompute)
        if running:
            return Admitted(head.id, slots=slots)
        need = sum(n.length for n in head.path()) + slots if kind == "expand" else self.memory.used + slots
        return Admitted(head.id, slots=slots, error=KVBudgetExceeded(need, self.policy.budget_tokens, kind))

    # ---- the decode step -----------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Start as many waiting rows of the searches that have the turn as fit (moved to
        ``running``); the head of an idle engine that cannot start at all fails its expansion (a
        single row does not fit) and the next is tried."""
        plan, got, eligible = StepPlan(), None, []
        while got is None:
            eligible = [r for r in self.waiting if self.turns.admits(_account(r))]
            if not eligible:
                break
            head = eligible[0].job
            queue = [(r.owner, first_page(r)) for r in eligible]
            finish = [r.stop.params.max_new_tokens for r in eligible]
            with self.accounting(head):
                got = self.admit(queue, self.owners(), "expand", finish=finish)
            if got.error is not None:
                self.fail(head, got.error)
                got = None
        if got is not None and got.rows:
            plan.admitted, plan.recompute, plan.job = eligible[: got.rows], got.recompute, head
            started = {id(r) for r in plan.admitted}
            self.waiting[:] = [r for r in self.waiting if id(r) not in started]
            self.running.extend(plan.admitted)  # before anything can fail: a failed job frees its running rows' slots
            now = time.perf_counter()
            plan.waited = [(r, now - r.queued_at) for r in plan.admitted]
        return plan

    def grow(self, plan: StepPlan) -> StepPlan:
        """Room for PAGE more slots for every row that has filled its slots; preempt the row that
        loses least (see :meth:`victim`) when even the policy cannot make room (it restarts later,
        sampling the same tokens). A lone row that cannot grow goes below the floor under a policy
        that degrades (its path token-extracted, :meth:`MemoryManager.below_floor`), else fails its
        expansion."""
        while True:
            needy = [r for r in self.running if r.capacity <= r.fed]
            if not needy:
                return plan
            need = sum(page(r) for r in needy)
            with self.accounting(needy[0].job):
                room = self.memory.make_room(need, PAGE * len(self.running), self.owners())
                if not room and len(self.running) == 1 and self.policy.capabilities.degrades:
                    room = self.memory.below_floor(self.owners(), need, PAGE)
            if room:
                break
            if len(self.running) == 1:
                row = self.running[0]
                need_alone = sum(n.length for n in row.owner.path()) + row.stop.params.max_new_tokens
                self.fail(row.job, KVBudgetExceeded(need_alone, self.policy.budget_tokens))
                continue
            victim = self.victim()
            plan.thrown.append(victim.fed)
            plan.preempted.append(self.preempt(victim))
        plan.grown = [(r, page(r)) for r in needy]
        return plan

    def victim(self) -> Row:
        """The running row a preemption costs least: one of a search without the turn first, then
        the fewest decode tokens computed (thrown away by its restart), then the youngest."""
        last = len(self.running) - 1
        ranked = [(self.turns.admits(_account(r)), r.fed, last - i) for i, r in enumerate(self.running)]
        return self.running[min(range(len(ranked)), key=ranked.__getitem__)]

    def preempt(self, row: Row) -> Row:
        """``row`` gives up its slots and waits again, in its place by (job start, request order)."""
        self.running.remove(row)
        for ext in row.restart():
            self.memory.store.pool.free(ext)
        order = (row.job.started, row.order)
        row.queued_at = time.perf_counter()
        self.waiting.insert(sum((r.job.started, r.order) < order for r in self.waiting), row)
        return row

    def restore_ranked(self, wants: Sequence[tuple[int, torch.Tensor]]) -> int:
        """On-demand rehydration into room the running rows will not need: what they may still
        decode stays free (restored chunks of an active path cannot be evicted again, so taking that
        room could stop a row). Returns the tokens restored."""
        with self.accounting(self.running[0].job):
            ahead = sum(max(r.stop.params.max_new_tokens - r.capacity, 0) for r in self.running)
            return self.memory.restore_ranked(wants, reserve=ahead)


def _account(row: Row) -> object | None:
    """The account (search) a row's expansion belongs to (None: outside any)."""
    return getattr(row.job, "account", None)


def page(row: Row) -> int:
    """Slots a full row gets next (never past its max_new_tokens)."""
    return min(PAGE, row.stop.params.max_new_tokens - row.capacity)


def first_page(row: Row) -> int:
    """Slots a row starts with."""
    return min(PAGE, row.stop.params.max_new_tokens)
