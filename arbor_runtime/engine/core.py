"""The engine: every runtime operation, from any number of threads, runs here in shared steps.

Controllers stay plain synchronous Python: ``rt.expand(...)`` returns children. Each public call
becomes a :class:`Work` submitted to the engine and waits for it. Whichever waiting thread finds
no driver becomes the driver and runs engine cycles until its own work is done, then hands over;
every cycle serves all submitted work at once:

    take new work -> prefills / releases in submission order -> one decode step for every row
    of every expansion in flight (schedule -> run -> postprocess) -> wake threads whose work is done

What runs, waits or gives way is decided by the :class:`~arbor_runtime.engine.scheduler.Scheduler`
(it holds the waiting and running rows and admits every work's memory, prefills and choose passes
included); the engine carries its plans out (slots, recomputes, the forward) and postprocesses.

So several searches running in threads share each model step (one batch across trees), and one
search alone runs exactly as before. Only the driver touches runtime state; other threads only
enqueue work and read their own nodes. A row's tokens never depend on which rows it was batched
with (its sampling stream is seeded from its node's content, see ``sampling.row_seed``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from arbor_runtime.engine.scheduler import PAGE, Scheduler, StepPlan, first_page
from arbor_runtime.engine.turns import Demand
from arbor_runtime.errors import NotYet
from arbor_runtime.events import EventLog
from arbor_runtime.generation import Row, StopChecker, add_own_attention, decode_batch, postprocess, sample_into
from arbor_runtime.grammar import GrammarCompiler
from arbor_runtime.kv import Extent
from arbor_runtime.metrics import RuntimeMetrics
from arbor_runtime.sampling import row_seed
from arbor_runtime.tree import Node

if TYPE_CHECKING:
    from arbor_runtime.attention.tree import TreeBatch
    from arbor_runtime.backend import ModelBackend
    from arbor_runtime.kv import KVStore
    from arbor_runtime.memory import MemoryManager
    from arbor_runtime.nodes import NodeTable
    from arbor_runtime.policies.base import Policy

__all__ = ["PAGE", "Account", "Engine", "EngineHost", "ExpandJob", "Work"]


@dataclass(slots=True)
class Account:
    """Where one caller's work is counted (a problem's search, in a run with many at once); also
    what tells searches apart for search-level admission (:mod:`~arbor_runtime.engine.turns`).
    ``closed``: the account's ``rt.account()`` block has ended (its search is over)."""

    metrics: RuntimeMetrics = field(default_factory=RuntimeMetrics)
    events: EventLog = field(default_factory=EventLog)
    closed: bool = False


@dataclass(eq=False, slots=True)
class Work:
    """One submitted operation: ``run`` (a prefill, a release) or an expansion (:class:`ExpandJob`)."""

    name: str
    account: Account | None
    run: Callable[[], Any] | None = None
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    started: float = 0.0
    peak: int = 0  # most pool slots in use while this work was in flight
    waiting_since: float | None = None  # when it first had to wait for room or for its search's turn


@dataclass(eq=False, slots=True)
class ExpandJob(Work):
    """An expansion in flight: its rows, and its children as they finish."""

    requests: Sequence[tuple[Node, int]] = ()
    stops: Sequence[StopChecker] = ()  # one per request: its sampling params and when its rows end
    grammar: GrammarCompiler | None = None  # matchers for requests sampled under a regex or grammar
    rows: list[Row] = field(default_factory=list)
    children: dict[int, Node] = field(default_factory=dict)


class EngineAccounts(Protocol):
    """What the engine uses of :class:`~arbor_runtime.accounts.Accounts` (a protocol: that module
    imports this one)."""

    def accounting(self, work: Work) -> AbstractContextManager[None]: ...

    def targets(self, work: Work | None = None) -> list[RuntimeMetrics]: ...

    def end(self, work: Work) -> None: ...


class EngineRunner(Protocol):
    """What the engine uses of :class:`~arbor_runtime.runner.Runner` (a protocol, as above)."""

    def take_attention(self, batch: TreeBatch) -> None: ...

    def free_slots(self, extents: Sequence[Extent]) -> None: ...


class EnginePrefiller(Protocol):
    """What the engine uses of :class:`~arbor_runtime.engine.prefill.Prefiller` (which holds the engine)."""

    def recompute_all(self, nodes: Sequence[Node]) -> None: ...


class EngineHost(Protocol):
    """What the engine uses of the runtime that owns it (:class:`~arbor_runtime.runtime.Runtime`):
    its collaborators, the callback that makes a finished row a block, and the op log.

    Declared here so the engine names no module above it; the scheduler takes its collaborators
    (memory manager, policy, accounting) directly.
    """

    store: KVStore
    memory: MemoryManager
    backend: ModelBackend
    policy: Policy
    table: NodeTable
    accounts: EngineAccounts
    runner: EngineRunner
    prefiller: EnginePrefiller
    #: the runtime's own counts (per-cause waits and batch sizes go there as well as to each account)
    metrics: RuntimeMetrics

    def child_from_row(self, row: Row) -> Node: ...

    def log_op(self, entry: dict) -> None: ...


class Engine:
    """Runs the runtime's work: immediate operations, and the rows of every expansion in flight."""

    def __init__(self, rt: EngineHost) -> None:
        self.rt = rt
        #: decides what runs: holds the waiting and running rows, admits every work's memory
        self.scheduler = Scheduler(rt.memory, rt.policy, rt.accounts.accounting, self._fail, self._current_account)
        self.jobs: list[ExpandJob] = []
        self._pending: list[Work] = []
        self._in_flight: list[Work] = []  # started, not done (their memory peaks are tracked)
        self._cv = threading.Condition()
        self._driving = False
        self._submitted = 0  # works submitted so far (an idle driver waits for the next)
        self._progress = False  # whether the cycle in hand did anything (else the driver waits)

    @property
    def waiting(self) -> list[Row]:
        """Rows admitted to no step yet (or preempted), in the order they start."""
        return self.scheduler.waiting

    @property
    def running(self) -> list[Row]:
        """Rows decoding now."""
        return self.scheduler.running

    @property
    def busy(self) -> bool:
        """Whether any work is queued or in flight."""
        return bool(self._pending or self._in_flight or self._driving)

    # ---- submission (any thread) ---------------------------------------------------------
    def submit(self, work: Work) -> Any:
        """Enqueue ``work``, drive the engine when nobody else does, return its result (or raise)."""
        work.started = time.perf_counter()
        with self._cv:
            self._pending.append(work)
            self._submitted += 1
            self._cv.notify_all()  # a driver idle while searches wait for their turn looks again
            while not work.done and self._driving:
                self._cv.wait()
            if not work.done:
                self._driving = True
        if not work.done:
            try:
                while not work.done:
                    self._cycle()
            finally:
                with self._cv:
                    self._driving = False
                    self._cv.notify_all()
        if work.error is not None:
            raise work.error
        return work.result

    # ---- one cycle (driver only) ---------------------------------------------------------
    def _cycle(self) -> None:
        start, self._progress, new = time.perf_counter(), False, []
        try:
            with self._cv:
                new, self._pending, seen = self._pending, [], self._submitted
            demand = self._take_turns(new)
            for work in new:
                if isinstance(work, ExpandJob):
                    self._start(work)
                else:
                    self._run_now(work)
            if self.waiting or self.running:
                self._step()
            self._charge_turn_wait(demand, time.perf_counter() - start)
        except BaseException as exc:  # a bug or an interrupt: every caller hears of it, none waits forever
            with self._cv:  # taken this cycle, not started yet: they fail too
                self._pending[:0] = [w for w in new if not w.done and w not in self._in_flight]
            self._abort(exc)
            self._progress = True
        with self._cv:
            self._cv.notify_all()
            if not self._progress:  # only searches without the turn have work: wait for news
                self._cv.wait_for(lambda: self._submitted != seen, timeout=IDLE_POLL)

    # ---- search-level admission ----------------------------------------------------------
    def _current_account(self) -> Account | None:
        work = self.rt.accounts.work
        return None if work is None else work.account

    def _take_turns(self, new: Sequence[Work]) -> dict[int, tuple[Account, Demand]]:
        """Each search's demand now (its queued and running rows, prefills and choose passes) and
        the searches that may start work this cycle (the scheduler's turns)."""
        demand: dict[int, tuple[Account, list]] = {}
        fresh = {(id(w.account), n.tree_id) for w in new if isinstance(w, ExpandJob) for n, _ in w.requests}

        def add(account: Account | None, entries: Demand) -> None:
            if account is not None:
                demand.setdefault(id(account), (account, []))[1].extend(entries)

        for job in self.jobs:
            add(job.account, [(r.owner, max(r.capacity, first_page(r))) for r in job.rows if not r.stop_reason])
        for work in new:
            if isinstance(work, ExpandJob):
                requests = zip(work.requests, work.stops, strict=True)
                add(work.account, [(n, first_page_of(stop)) for (n, k), stop in requests for _ in range(k)])
            else:  # a work without an estimate still counts as the search's work waiting for a turn
                add(work.account, [work.run.demand()] if hasattr(work.run, "demand") else [])
        turns = self.scheduler.turns
        turns.update(demand, self.rt.policy.kv_budget_tokens, fresh)
        self.rt.memory.parked = turns.parked(self.rt.memory.nodes, self.rt.store.block_ids())
        return demand

    def _charge_turn_wait(self, demand: dict[int, tuple[Account, Demand]], seconds: float) -> None:
        """A cycle's seconds to each search that had work but not the turn."""
        for account in self.scheduler.turns.waiting(demand):
            account.metrics.turn_wait_seconds += seconds
            self.rt.metrics.turn_wait_seconds += seconds

    def _abort(self, error: BaseException) -> None:
        """Fail every expansion in flight and every queued work with ``error``."""
        for job in list(self.jobs):
            self._fail(job, error)
        with self._cv:
            queued, self._pending = self._pending, []
        for work in queued + [w for w in self._in_flight if not w.done]:
            work.error = error
            if work in self._in_flight:
                self._end(work)
            else:
                work.done = True

    def _end(self, work: Work) -> None:
        self._in_flight.remove(work)
        self.rt.accounts.end(work)
        work.done = True

    def work_started(self, work: Work) -> None:
        if work not in self._in_flight:
            self._in_flight.append(work)
            work.peak = self.rt.store.pool.used

    def _run_now(self, work: Work) -> None:
        """A prefill or release, now; a prefill that must wait for room goes back to the queue."""
        self.work_started(work)
        try:
            with self.rt.accounts.accounting(work):
                work.result = work.run()
        except NotYet:
            if work.waiting_since is None:
                work.waiting_since = time.perf_counter()
            with self._cv:
                self._pending.insert(0, work)
            return
        except BaseException as exc:  # the caller's thread re-raises it
            work.error = exc
        if work.waiting_since is not None:
            for metrics in self.rt.accounts.targets(work):
                metrics.wait_seconds += time.perf_counter() - work.waiting_since
        self._progress = True
        self._end(work)

    # ---- expansions ----------------------------------------------------------------------
    def _start(self, job: ExpandJob) -> None:
        """Rows for the job's requests; their sampling streams are fixed here."""
        rt = self.rt
        self.work_started(job)
        with rt.accounts.accounting(job):
            rt.memory.begin([node for node, _ in job.requests], job.account)
            for (node, n), stop in zip(job.requests, job.stops, strict=True):
                params = stop.params
                base = params.seed if params.seed is not None else rt.table.tree_seed(node)
                first = 0 if params.seed is not None else node.spawned
                for k in range(n):
                    seed = row_seed(base, node.key, first + k)
                    matcher = job.grammar.matcher(params) if params.constrained else None
                    row = Row(node, rt.table.next_id(), len(job.rows), seed, job=job, stop=stop, matcher=matcher)
                    job.rows.append(row)
                node.spawned += n
        self.jobs.append(job)
        self.scheduler.enqueue(job.rows)
        self._progress = True

    def _step(self) -> None:
        """schedule -> run -> postprocess, for every row in flight: the scheduler's plan is made in
        two halves (rows that start, then pages and preemptions), each carried out before the next
        is decided, as each reads the pool the previous one left."""
        rt = self.rt
        plan = self.scheduler.schedule()
        self._start_rows(plan)
        self._grow(self.scheduler.grow(plan))
        if not self.running:
            return
        self._rehydrate_wanted()
        reach = sum(r.stop.params.max_new_tokens - r.fed for r in self.running)
        # a window scores prefills only; a policy that plans only under pressure is not scored before it
        stats = rt.memory.planner.records_statistics(reach) and not rt.policy.observation_window
        batch, ids, pos = decode_batch(rt.store, self.running, stats, rt.backend.kernel)
        start = time.perf_counter()
        logits = rt.backend.forward(batch, ids, pos)[:, -1]  # (R, V)
        if any(r.fed == 0 for r in self.running) and self._rehydrate_wanted():
            # a row's first decode step was a probe: what its retrieval wanted is back, run it again
            batch, ids, pos = decode_batch(rt.store, self.running, stats, rt.backend.kernel)
            logits = rt.backend.forward(batch, ids, pos)[:, -1]
        self._charge_step(time.perf_counter() - start)
        self._progress = True
        rt.runner.take_attention(batch)
        add_own_attention(self.running, batch)
        finished = []
        for stop, idx in _rows_by_stop(self.running).items():
            finished += postprocess([self.running[i] for i in idx], logits[idx], stop.params, stop)
        for row in finished:
            self.running.remove(row)
            self._finish_row(row)

    def _start_rows(self, plan: StepPlan) -> None:
        """Rows the scheduler admitted start: what their paths lack is recomputed, they get their
        first slots and sample their first token from the stored logits."""
        rt = self.rt
        if not plan.admitted:
            return
        self._progress = True
        for row, seconds in plan.waited:
            for metrics in rt.accounts.targets(row.job):
                metrics.wait_seconds += seconds
        with rt.accounts.accounting(plan.job):
            rt.prefiller.recompute_all(plan.recompute)
        for row in plan.admitted:
            row.add_slots(rt.store.pool.alloc(first_page(row)), rt.store.pool.joins)
        for stop, idx in _rows_by_stop(plan.admitted).items():
            mine = [plan.admitted[i] for i in idx]
            logits = torch.stack([rt.store.get(r.owner.id).next_logits for r in mine])
            sample_into(mine, logits, stop.params, stop)
        self.note_peak()

    def _grow(self, plan: StepPlan) -> None:
        """Rows the scheduler grew get their pages; the rows it preempted are counted."""
        rt = self.rt
        for row, thrown in zip(plan.preempted, plan.thrown, strict=True):
            for metrics in rt.accounts.targets(row.job):
                metrics.preemptions += 1
                metrics.preempted_tokens += thrown
        if not plan.grown:
            return
        for row, page in plan.grown:
            got = rt.store.pool.extend(row.extents[-1], page)
            row.add_slots([Extent(row.extents[-1].end, got)] if got else [], rt.store.pool.joins)
            if got < page:
                row.add_slots(rt.store.pool.alloc(page - got), rt.store.pool.joins)
        self.note_peak()

    def _rehydrate_wanted(self) -> int:
        """On-demand rehydration (a sparse policy's ``rehydrate=ranked``): the evicted chunks of the
        running paths that the last step's retrieval wanted come back, most wanted first, into room
        the running rows will not need: what they may still decode stays free (restored chunks of an
        active path cannot be evicted again, so taking that room could stop a row). Returns the
        tokens restored. A step in which a row decodes its first token runs twice when anything
        came back: the first pass only asks what the row's queries want."""
        sparse = self.rt.backend.sparse
        if sparse is None or not sparse.on_demand:
            return 0
        paths = {n.id for r in self.running for n in r.owner.kv_path()}
        wants = [(block_id, idx) for block_id, idx in sparse.wanted() if block_id in paths]
        if not wants:
            return 0
        return self.scheduler.restore_ranked(wants)

    def _finish_row(self, row: Row) -> None:
        job = row.job
        with self.rt.accounts.accounting(job):
            job.children[row.order] = self.rt.child_from_row(row)
        if len(job.children) == len(job.rows):
            self._complete(job)

    def _complete(self, job: ExpandJob) -> None:
        rt = self.rt
        self.jobs.remove(job)
        children = [job.children[i] for i in range(len(job.rows))]
        rt.table.order(children)
        out, k = [], 0
        for _, n in job.requests:
            out.append(children[k : k + n])
            k += n
        with rt.accounts.accounting(job):
            rt.memory.after([node for node, _ in job.requests], children, running=self.running_owners())
        requests = [[n.id, k] for n, k in job.requests]
        rt.log_op({"op": "expand", "requests": requests, "children": [[c.id for c in kids] for kids in out]})
        job.result = out
        self._end(job)

    def _fail(self, job: ExpandJob, error: BaseException) -> None:
        """An expansion that cannot finish: its rows leave, its finished children go as if never
        made (as a failed prefill's node does: out of the store, the memory manager's active set and
        frontier, the node tables and the counts of the job's account)."""
        rt = self.rt
        for row in [r for r in self.running if r.job is job]:
            self.running.remove(row)
            rt.runner.free_slots(row.extents)
        self.waiting[:] = [r for r in self.waiting if r.job is not job]
        with rt.accounts.accounting(job):  # the children were counted there when they finished
            for child in job.children.values():
                if not child.released:
                    rt.memory.forget(rt.table.forget_subtree(child, rt.accounts.targets()))
                rt.table.discard(child, rt.accounts.targets())
        if job in self.jobs:
            self.jobs.remove(job)
        job.error = error
        self._end(job)

    # ---- accounting ----------------------------------------------------------------------
    def running_owners(self) -> list[Node]:
        """The nodes whose rows are decoding now (their paths are active)."""
        return self.scheduler.owners()

    def note_peak(self) -> None:
        """Pool slots in use now count toward the peak of every work in flight."""
        used = self.rt.store.pool.used
        for work in self._in_flight:
            work.peak = max(work.peak, used)

    def _charge_step(self, seconds: float) -> None:
        """A forward's time, shared by the jobs in it by their rows."""
        rows: dict[int, tuple[ExpandJob, int]] = {}
        for row in self.running:
            job, n = rows.get(id(row.job), (row.job, 0))
            rows[id(row.job)] = (job, n + 1)
        for job, n in rows.values():
            if job.account is not None:
                job.account.metrics.forward_calls += 1
                job.account.metrics.model_seconds += seconds * n / len(self.running)
        accounts = {id(job.account): job.account for job, _ in rows.values() if job.account is not None}
        for metrics in [self.rt.metrics] + [a.metrics for a in accounts.values()]:
            metrics.decode_steps += 1
            metrics.decode_step_rows += len(self.running)


#: seconds an idle driver (only searches without the turn have work) waits for new work before it looks again
IDLE_POLL = 0.02


def first_page_of(stop: StopChecker) -> int:
    """Slots a row sampled under ``stop`` starts with."""
    return min(PAGE, stop.params.max_new_tokens)


def _rows_by_stop(rows: Sequence[Row]) -> dict[StopChecker, list[int]]:
    """Positions of ``rows`` per stop checker (one per request: same sampling parameters), in order
    of first appearance."""
    out: dict[StopChecker, list[int]] = {}
    for i, row in enumerate(rows):
        out.setdefault(row.stop, []).append(i)
    return out
