"""The executor: carries out the scheduler's plans, and decides nothing.

A :class:`~arbor_runtime.engine.scheduler.StepPlan` is carried out in its order: the admitted rows'
room (the memory manager asks the policy, restores their paths), the rows move to running, what
their paths lack is recomputed, they get their first slots and sample their first token from the
stored logits; then the growth ladder, rung by rung, until the room is made (preempting each
rung's victim on the way, or failing a lone row's expansion). A
:class:`~arbor_runtime.engine.scheduler.WorkPlan` (a prefill chunk, a choose pass) is its admission
and recompute. Every memory operation is counted to the work it serves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from arbor_runtime.engine.scheduler import PAGE, Growth, Scheduler, StepPlan, WorkPlan, first_page
from arbor_runtime.generation import Row, StopChecker, sample_into
from arbor_runtime.kv import Extent

if TYPE_CHECKING:
    from arbor_runtime.accounts import Accounts
    from arbor_runtime.engine.prefill import Prefiller
    from arbor_runtime.kv import KVStore
    from arbor_runtime.memory import MemoryManager
    from arbor_runtime.tree import Node


class Executor:
    """Carries out step and work plans over one runtime's memory manager, store and rows.

    Args:
        scheduler: told what was carried out (rows started, preempted); memory: evictions and
        restores; store: the pool the rows' slots come from; prefiller: recomputes dropped blocks;
        accounts: where each operation is counted; fail: ``fail(job, error)`` ends an expansion
        (the engine's: its rows, children and waiting caller).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        memory: MemoryManager,
        store: KVStore,
        prefiller: Prefiller,
        accounts: Accounts,
        fail: Callable[[object, BaseException], None],
    ) -> None:
        self.scheduler, self.memory, self.store, self.prefiller = scheduler, memory, store, prefiller
        self.accounts, self.fail = accounts, fail

    # ---- a decode step ---------------------------------------------------------------------
    def step(self, plan: StepPlan) -> bool:
        """Carry out a step plan without a failure (see the module docstring); True when rows started."""
        if plan.admitted:
            self._start(plan)
        self._grow(plan.growth)
        return bool(plan.admitted)

    def _start(self, plan: StepPlan) -> None:
        """Admitted rows start: their room, then running, what their paths lack recomputed, their
        first slots, their first token sampled from the stored logits."""
        with self.accounts.accounting(plan.job):
            self.memory.admit(plan.admit, [r.owner for r in plan.admitted])
        self.scheduler.start(plan.admitted)  # before anything can fail: a failed job frees its running rows' slots
        for row, seconds in plan.waited:
            for metrics in self.accounts.targets(row.job):
                metrics.wait_seconds += seconds
        with self.accounts.accounting(plan.job):
            self.prefiller.recompute_all(plan.admit.recompute)
        pool = self.store.pool
        for row in plan.admitted:
            row.add_slots(pool.alloc(first_page(row)), pool.joins)
        for stop, idx in rows_by_stop(plan.admitted).items():
            mine = [plan.admitted[i] for i in idx]
            logits = torch.stack([self.store.get(r.owner.id).next_logits for r in mine])
            sample_into(mine, logits, stop.params, stop)
        self.accounts.note_peak()

    def _grow(self, ladder: Sequence[Growth]) -> None:
        """The growth ladder, rung by rung: the first whose room is made gives its rows their pages;
        a rung that cannot preempts its victim for the next, or fails a lone row's expansion."""
        for rung in ladder:
            with self.accounts.accounting(rung.job):
                room = self.memory.make_room(rung.need, rung.ahead, rung.owners)
                if not room and rung.below_floor:
                    room = self.memory.below_floor(rung.owners, rung.need, PAGE)
            if room:
                self._pages(rung.grown)
                return
            if rung.victim is not None:
                self._preempt(rung.victim)
            elif rung.error is not None:
                self.fail(rung.job, rung.error)

    def _pages(self, grown: Sequence[tuple[Row, int]]) -> None:
        """Each row's next slots, continuing its last extent where the pool allows."""
        pool = self.store.pool
        for row, page in grown:
            got = pool.extend(row.extents[-1], page)
            row.add_slots([Extent(row.extents[-1].end, got)] if got else [], pool.joins)
            if got < page:
                row.add_slots(pool.alloc(page - got), pool.joins)
        if grown:
            self.accounts.note_peak()

    def _preempt(self, row: Row) -> None:
        """``row`` gives up its slots and waits again (it restarts from its first token, sampling the
        same tokens); the decode tokens it threw away are counted."""
        thrown = row.fed
        for ext in row.restart():
            self.store.pool.free(ext)
        self.scheduler.requeue(row)
        for metrics in self.accounts.targets(row.job):
            metrics.preemptions += 1
            metrics.preempted_tokens += thrown

    # ---- a prefill chunk or a choose pass ---------------------------------------------------------
    def work(self, plan: WorkPlan, node: Node) -> int:
        """Carry out a work's admission at ``node`` (room, restores, recompute); returns its slots."""
        self.memory.admit(plan.admit, [node])
        self.prefiller.recompute_all(plan.admit.recompute)
        return plan.slots


def rows_by_stop(rows: Sequence[Row]) -> dict[StopChecker, list[int]]:
    """Positions of ``rows`` per stop checker (one per request: same sampling parameters), in order
    of first appearance."""
    out: dict[StopChecker, list[int]] = {}
    for i, row in enumerate(rows):
        out.setdefault(row.stop, []).append(i)
    return out
