"""The scheduler: the one place that decides what runs, what waits and what gives way.

It holds the ``waiting`` and ``running`` rows (nano-vllm's ``Scheduler``) and the searches' turns,
reads the pure :class:`~arbor_runtime.planner.MemoryPlanner`, and returns plans; it carries nothing
out (no store change, no policy call, no memory manager: it moves nothing). The engine's
:class:`~arbor_runtime.engine.executor.Executor` carries every plan out:

    schedule() -> StepPlan        one decode step: an expansion that can never fit fails, or rows
                                  start (their admission, what to recompute) and running rows grow
    plan_work(request) -> WorkPlan  a prefill chunk or a choose pass: run (admitted, how many
                                  slots), wait (rows in flight will free room, or its search has
                                  no turn), or fail (it cannot fit even alone)

How much room a policy's retention plan makes is known only once the policy is asked, on the store
as it is then; so a step's growth is a ladder decided up front (:class:`Growth`): room for the rows
that filled their slots, else the row that loses least is preempted and the rest try again, and a
lone row that cannot grow goes below the floor (a policy that degrades) or fails its expansion.
The executor stops at the first rung whose room is made.

Above rows, whole searches take turns when the budget cannot hold every search's active path
(:class:`~arbor_runtime.engine.turns.Turns`, updated once a cycle by :meth:`Scheduler.take_turns`):
only admitted searches' rows start and their prefills and choose passes are admitted; the others wait.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from arbor_runtime.engine.turns import Demand, Turns
from arbor_runtime.plans import AdmitPlan

if TYPE_CHECKING:
    from arbor_runtime.errors import KVBudgetExceeded
    from arbor_runtime.generation import Row
    from arbor_runtime.planner import MemoryPlanner
    from arbor_runtime.tree import Node

#: pool slots a generating row is given at a time (like a KV page): its first PAGE tokens at
#: admission, then PAGE more whenever it fills them
PAGE = 8


@dataclass(frozen=True, slots=True)
class Request:
    """What a prefill or a choose pass asks the scheduler for: ``slots`` new slots at the end of the
    path to ``node`` (the work yields it; the engine answers with a :class:`WorkPlan`)."""

    node: Node
    slots: int
    kind: str = "prefill"


@dataclass(frozen=True, slots=True)
class WorkPlan:
    """The scheduler's answer to a :class:`Request`.

    Attributes:
        admit: the admission to carry out (``rows`` 1: the work runs now).
        slots: the slots admitted (a prefill's chunk may be fewer than asked).
        error: set when the work cannot fit even alone (it fails).
    """

    admit: AdmitPlan = field(default_factory=AdmitPlan)
    slots: int = 0
    error: KVBudgetExceeded | None = None

    @property
    def wait(self) -> bool:
        """Nothing runs now, but rows in flight will free room (or its search gets the turn)."""
        return self.admit.rows == 0 and self.error is None


@dataclass(frozen=True, slots=True)
class Growth:
    """One rung of a step's growth ladder: room for the running rows that filled their slots.

    Attributes:
        grown: (row, slots) each of those rows gets when the room is made.
        need: the slots they need together; ahead: more room a policy's plan makes for the next
            steps (a page per running row); owners: the running rows' path ends (active paths).
        job: the expansion the memory work is counted to (the first of those rows').
        victim: the row preempted when the room cannot be made (None: a lone row, the last rung).
        below_floor: a lone row goes below the floor when the room cannot be made (a policy that degrades).
        error: a lone row's expansion fails with it when neither makes room.
    """

    grown: list[tuple[Row, int]]
    need: int
    ahead: int
    owners: list[Node]
    job: object
    victim: Row | None = None
    below_floor: bool = False
    error: KVBudgetExceeded | None = None


@dataclass(slots=True)
class StepPlan:
    """Everything one decode step does about rows and memory, decided before any of it is carried out.

    Attributes:
        failed: an expansion whose first waiting row cannot fit even alone (nothing runs): it fails
            with ``error``, and the engine asks for the next plan.
        admitted: rows that start this step (from waiting to running), in queue order; ``job``: whose
            account their admission counts to; ``admit``: the planner's admission (the room they
            need, whole paths or pinned tokens, what to recompute); waited: (row, seconds it waited).
        growth: the ladder of :class:`Growth` rungs, tried in order until one makes room (empty:
            no running row has filled its slots).
    """

    failed: object = None
    error: KVBudgetExceeded | None = None
    admitted: list[Row] = field(default_factory=list)
    job: object = None
    admit: AdmitPlan = field(default_factory=AdmitPlan)
    waited: list[tuple[Row, float]] = field(default_factory=list)
    growth: list[Growth] = field(default_factory=list)


class Scheduler:
    """Decides every admission, growth and preemption over one memory planner (see the module docstring).

    Args:
        planner: what fits (pure arithmetic over the store and the memory config).
    """

    def __init__(self, planner: MemoryPlanner) -> None:
        self.planner = planner
        self.waiting: list[Row] = []
        self.running: list[Row] = []
        #: which searches may start work (updated once a cycle by :meth:`take_turns`)
        self.turns = Turns()

    def owners(self) -> list[Node]:
        """The nodes whose rows are decoding now (their paths are active)."""
        return [r.owner for r in self.running]

    # ---- bookkeeping the executor reports ------------------------------------------------------
    def enqueue(self, rows: Sequence[Row]) -> None:
        """New rows wait for admission, after those already waiting."""
        now = time.perf_counter()
        for row in rows:
            row.queued_at = now
        self.waiting.extend(rows)

    def start(self, rows: Sequence[Row]) -> None:
        """Admitted rows move from waiting to running."""
        started = {id(r) for r in rows}
        self.waiting[:] = [r for r in self.waiting if id(r) not in started]
        self.running.extend(rows)

    def requeue(self, row: Row) -> None:
        """A preempted row (its slots given back) waits again, in its place by (job start, request order)."""
        self.running.remove(row)
        order = (row.job.started, row.order)
        row.queued_at = time.perf_counter()
        self.waiting.insert(sum((r.job.started, r.order) < order for r in self.waiting), row)

    def drop(self, job: object) -> list[Row]:
        """A failed expansion's rows leave both lists; returns its running rows (their slots to free)."""
        running = [r for r in self.running if r.job is job]
        self.running[:] = [r for r in self.running if r.job is not job]
        self.waiting[:] = [r for r in self.waiting if r.job is not job]
        return running

    def take_turns(self, demand: Mapping[int, tuple[object, Demand]], fresh=()) -> None:
        """Which searches may start work this cycle, from each one's demand now (:meth:`Turns.update`)."""
        self.turns.update(demand, self.planner.holds, fresh)

    # ---- the decode step -----------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """One decode step's plan, without side effects: as many waiting rows of the searches that
        have the turn as fit start (an idle engine whose head cannot start at all fails that
        expansion instead: a single row does not fit), then the growth ladder of every running row."""
        plan = StepPlan()
        eligible = [r for r in self.waiting if self.turns.admits(_account(r))]
        if eligible:
            head = eligible[0].job
            queue = [(r.owner, first_page(r)) for r in eligible]
            finish = [r.stop.params.max_new_tokens for r in eligible]
            admit = self.planner.admission(queue, self.owners(), finish=finish)
            if admit.rows:
                now = time.perf_counter()
                plan.admitted, plan.job, plan.admit = eligible[: admit.rows], head, admit
                plan.waited = [(r, now - r.queued_at) for r in plan.admitted]
            elif not self.running:
                need = sum(n.length for n in eligible[0].owner.path()) + queue[0][1]
                plan.failed, plan.error = head, self.planner.exceeded(need, "expand")
                return plan
        plan.growth = self.growth(self.running + plan.admitted, started=plan.admitted)
        return plan

    def growth(self, running: Sequence[Row], started: Sequence[Row] = ()) -> list[Growth]:
        """The growth ladder over ``running`` (the rows ``started`` this step have their first page
        and nothing decoded: never short): room for PAGE more slots for every row that has filled
        its slots; when even the policy cannot make it, the row that loses least (:meth:`victim`)
        is preempted (it restarts later, sampling the same tokens) and the rest try again. A lone
        row that cannot grow goes below the floor under a policy that degrades (its path
        token-extracted, :meth:`MemoryManager.below_floor`), else fails its expansion."""
        running, new, ladder = list(running), {id(r) for r in started}, []
        needy = [r for r in running if id(r) not in new and r.capacity <= r.fed]
        pages = {id(r): page(r) for r in needy}
        victims = iter(self.victims(running))  # worked out once: preemption never reorders the rest
        while needy:
            grown = [(r, pages[id(r)]) for r in needy]
            owners = [r.owner for r in running]
            need, ahead, job = sum(n for _, n in grown), PAGE * len(running), needy[0].job
            if len(running) > 1:
                victim = next(victims)
                ladder.append(Growth(grown, need, ahead, owners, job, victim=victim))
                running.remove(victim)
                needy = [r for r in needy if r is not victim]
                continue
            row = running[0]
            need_alone = sum(n.length for n in row.owner.path()) + row.stop.params.max_new_tokens
            error = self.planner.exceeded(need_alone)
            ladder.append(Growth(grown, need, ahead, owners, job, below_floor=self.planner.degrades, error=error))
            break
        return ladder

    def victim(self, running: Sequence[Row]) -> Row:
        """The running row a preemption costs least: one of a search without the turn first, then
        the fewest decode tokens computed (thrown away by its restart), then the youngest."""
        return self.victims(running)[0]

    def victims(self, running: Sequence[Row]) -> list[Row]:
        """``running`` in the order the growth ladder preempts them (:meth:`victim` of what is left,
        again and again: taking one out never changes the order of the rest)."""
        keys = [(self.turns.admits(_account(r)), r.fed, -i) for i, r in enumerate(running)]
        return [running[i] for i in sorted(range(len(keys)), key=keys.__getitem__)]

    def reserve(self) -> int:
        """Slots the running rows may still decode into beyond their own (on-demand restores leave
        them free: restored chunks of an active path cannot be evicted again, so taking that room
        could stop a row)."""
        return sum(max(r.stop.params.max_new_tokens - r.capacity, 0) for r in self.running)

    # ---- prefills and choose passes --------------------------------------------------------------
    def plan_work(self, request: Request, account: object | None) -> WorkPlan:
        """Admit ``request`` next to the running rows, without side effects: a prefill or choose pass
        first with its path kept as it is; under a policy that prefills in chunks, then as a lone
        entry, a prefill cut to the configured chunk (the planner's :meth:`work_admission`). Nothing
        fits: wait while rows are running, else fail naming what was needed. The work of a search
        that does not have the turn (``account``) waits."""
        if not self.turns.admits(account):
            return WorkPlan(slots=request.slots)
        prefill = request.kind == "prefill"
        admit, slots = self.planner.work_admission(request.node, request.slots, self.owners(), prefill)
        if admit.rows or self.running:
            return WorkPlan(admit, slots)
        return WorkPlan(slots=slots, error=self.planner.exceeded(self.planner.used + slots, request.kind))


def _account(row: Row) -> object | None:
    """The account (search) a row's expansion belongs to (None: outside any)."""
    return getattr(row.job, "account", None)


def page(row: Row) -> int:
    """Slots a full row gets next (never past its max_new_tokens)."""
    return min(PAGE, row.stop.params.max_new_tokens - row.capacity)


def first_page(row: Row) -> int:
    """Slots a row starts with."""
    return min(PAGE, row.stop.params.max_new_tokens)
