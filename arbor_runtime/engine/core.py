"""The engine: every runtime operation, from any number of threads, runs here in shared steps.

Controllers stay plain synchronous Python: ``rt.expand(...)`` returns children. Each public call
becomes a :class:`Work` submitted to the engine and waits for it. Whichever waiting thread finds
no driver becomes the driver and runs engine cycles until its own work is done, then hands over;
every cycle serves all submitted work at once:

    take new work -> turns -> prefills / choose passes / releases in submission order -> one decode
    step for every row of every expansion in flight (schedule -> run -> postprocess) -> wake threads

What runs, waits or gives way is decided by the :class:`~arbor_runtime.engine.scheduler.Scheduler`,
in plans without side effects: a :class:`~arbor_runtime.engine.scheduler.StepPlan` per decode step,
a :class:`~arbor_runtime.engine.scheduler.WorkPlan` per prefill chunk or choose pass. The
:class:`~arbor_runtime.engine.executor.Executor` carries them out; the engine runs the forward and
postprocesses. A prefill or choose pass is a generator that yields what it needs
(:class:`~arbor_runtime.engine.scheduler.Request`) and is sent the slots admitted: it submits its
work to the scheduler instead of calling it, and a work that must wait stays suspended where it
stopped, its request planned again next cycle (waiting is a plan state, not an exception).

So several searches running in threads share each model step (one batch across trees), and one
search alone runs exactly as before. Only the driver touches runtime state; other threads only
enqueue work and read their own nodes. A row's tokens never depend on which rows it was batched
with (its sampling stream is seeded from its node's content, see ``sampling.row_seed``).

The engine takes its collaborators (scheduler, memory manager, store, backend, node table,
accounts, runner, prefiller, the runtime's metrics and op log), never the runtime.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

from arbor_runtime.engine.executor import Executor, rows_by_stop
from arbor_runtime.engine.scheduler import PAGE, Scheduler
from arbor_runtime.engine.turns import Demand
from arbor_runtime.engine.work import Account, ExpandJob, Work
from arbor_runtime.errors import NodeError
from arbor_runtime.generation import DecodeLayout, Row, StopChecker, add_own_attention, decode_batch, postprocess
from arbor_runtime.sampling import row_seed

if TYPE_CHECKING:
    from arbor_runtime.accounts import Accounts
    from arbor_runtime.backend import ModelBackend
    from arbor_runtime.engine.prefill import Prefiller
    from arbor_runtime.kv import KVStore
    from arbor_runtime.memory import MemoryManager
    from arbor_runtime.metrics import RuntimeMetrics
    from arbor_runtime.nodes import NodeTable
    from arbor_runtime.runner import Runner

__all__ = ["Engine"]

#: what a waiting work's run answers (it is queued again)
WAIT = object()


class Engine:
    """Runs the runtime's work: immediate operations, and the rows of every expansion in flight.

    Args:
        scheduler: decides (plans); memory: operation events and the parked blocks; store, backend:
        the decode step's batch and forward; table: node ids, seeds, order and forgetting; accounts:
        where counts go, the works in flight; runner: attention records and slot frees; prefiller:
        finished rows become blocks, recomputes (for the executor, which the engine builds over
        these); metrics: the runtime's own counts; oplog: public operations in completion order.
    """

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        memory: MemoryManager,
        store: KVStore,
        backend: ModelBackend,
        table: NodeTable,
        accounts: Accounts,
        runner: Runner,
        prefiller: Prefiller,
        metrics: RuntimeMetrics,
        oplog: list[dict],
    ) -> None:
        self.scheduler, self.memory = scheduler, memory
        self.store, self.backend, self.table, self.accounts, self.runner = store, backend, table, accounts, runner
        self.prefiller, self.metrics, self.oplog = prefiller, metrics, oplog
        #: carries out every plan of the scheduler
        self.executor = Executor(scheduler, memory, store, prefiller, accounts, self._fail)
        self._layout = DecodeLayout()  # what the running rows read, kept across decode steps
        self.jobs: list[ExpandJob] = []
        self._pending: list[Work] = []
        self._cv = threading.Condition()
        self._driving = False
        self._submitted = 0  # works submitted so far (an idle driver waits for the next)
        self._progress = False  # whether the cycle in hand did anything (else the driver waits)
        self._interrupted: BaseException | None = None  # set by :meth:`interrupt`

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
        return bool(self._pending or self.accounts.in_flight or self._driving)

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

    def interrupt(self, error: BaseException) -> None:
        """Any thread: fail every work in flight, queued or submitted from now on with ``error`` (a
        Ctrl-C in a thread that is not the driver: the searches sharing this runtime stop at the
        driver's next cycle instead of finishing their problems)."""
        with self._cv:
            self._interrupted = error
            self._submitted += 1  # an idle driver looks again
            self._cv.notify_all()

    # ---- one cycle (driver only) ---------------------------------------------------------
    def _cycle(self) -> None:
        start, self._progress, new = time.perf_counter(), False, []
        try:
            if self._interrupted is not None:
                raise self._interrupted
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
                self._pending[:0] = [w for w in new if not w.done and w not in self.accounts.in_flight]
            self._abort(exc)
            self._progress = True
        with self._cv:
            self._cv.notify_all()
            if not self._progress:  # only searches without the turn have work: wait for news
                self._cv.wait_for(lambda: self._submitted != seen, timeout=IDLE_POLL)

    # ---- search-level admission ----------------------------------------------------------
    def _take_turns(self, new: Sequence[Work]) -> dict[int, tuple[Account, Demand]]:
        """Each search's demand now (its queued and running rows, prefills and choose passes), the
        searches that may start work this cycle (the scheduler's turns) and the blocks of the others
        (parked: they leave for the host tier first when room is short)."""
        demand: dict[int, tuple[Account, list]] = {}
        fresh = {(id(w.account), n.tree_id) for w in new if isinstance(w, ExpandJob) for n, _ in w.requests}

        def add(account: Account | None, entries: Demand) -> None:
            if account is not None:
                demand.setdefault(id(account), (account, []))[1].extend(entries)

        for job in self.jobs:
            add(job.account, [(r.owner, max(r.capacity, first_page_of(r.stop))) for r in job.rows if not r.stop_reason])
        for work in new:
            if isinstance(work, ExpandJob):
                requests = zip(work.requests, work.stops, strict=True)
                add(work.account, [(n, first_page_of(stop)) for (n, k), stop in requests for _ in range(k)])
            else:  # a work without an estimate still counts as the search's work waiting for a turn
                add(work.account, [work.run.demand()] if hasattr(work.run, "demand") else [])
        self.scheduler.take_turns(demand, fresh)
        self.memory.parked = self.scheduler.turns.parked(self.memory.nodes, self.store.block_ids())
        return demand

    def _charge_turn_wait(self, demand: dict[int, tuple[Account, Demand]], seconds: float) -> None:
        """A cycle's seconds to each search that had work but not the turn."""
        for account in self.scheduler.turns.waiting(demand):
            account.metrics.turn_wait_seconds += seconds
            self.metrics.turn_wait_seconds += seconds

    def _abort(self, error: BaseException) -> None:
        """Fail every expansion in flight and every queued work with ``error``."""
        for job in list(self.jobs):
            self._fail(job, error)
        with self._cv:
            queued, self._pending = self._pending, []
        for work in queued + [w for w in self.accounts.in_flight if not w.done]:
            work.error = error
            if work in self.accounts.in_flight:
                self._end(work)
            else:
                work.done = True

    def _end(self, work: Work) -> None:
        self.accounts.end(work)
        work.done = True

    # ---- prefills, choose passes, releases ----------------------------------------------------
    def _run_now(self, work: Work) -> None:
        """A work now; one that must wait for room or its turn goes back to the queue, suspended."""
        self.accounts.start(work)
        with self.accounts.accounting(work):
            try:
                outcome = self._drive(work)
            except BaseException as exc:  # the caller's thread re-raises it
                work.error, outcome = exc, None
        if outcome is WAIT:
            if work.waiting_since is None:
                work.waiting_since = time.perf_counter()
            with self._cv:
                self._pending.insert(0, work)
            return
        work.result = outcome
        if work.waiting_since is not None:
            for metrics in self.accounts.targets(work):
                metrics.wait_seconds += time.perf_counter() - work.waiting_since
        self._progress = True
        self._end(work)

    def _drive(self, work: Work) -> Any:
        """Run ``work`` until it is done (its result) or must wait (:data:`WAIT`): each
        :class:`Request` it yields is planned by the scheduler and, when it runs, carried out by the
        executor, and the slots admitted are sent back; a request that can never fit is thrown into
        the work (it undoes what it began and raises)."""
        try:
            if work.steps is None:
                out = work.run()
                if not isinstance(out, Generator):
                    return out
                work.steps, work.request = out, out.send(None)
            else:  # it waited
                work.run.check()
            while True:
                plan = self.scheduler.plan_work(work.request, work.account)
                if plan.wait:
                    return WAIT
                if plan.error is not None:
                    work.request = work.steps.throw(plan.error)
                else:
                    work.request = work.steps.send(self.executor.work(plan, work.request.node))
        except StopIteration as stop:
            return stop.value

    # ---- expansions ----------------------------------------------------------------------
    def _start(self, job: ExpandJob) -> None:
        """Rows for the job's requests; their sampling streams are fixed here. A node released since the
        caller checked it (by another thread, its release run first) fails the job alone."""
        self.accounts.start(job)
        gone = next((node for node, _ in job.requests if node.released), None)
        if gone is not None:
            job.error = NodeError(f"node {gone.id} was released (by another thread) before its expansion started")
            self._end(job)
            return
        with self.accounts.accounting(job):
            self.memory.begin([node for node, _ in job.requests], job.account)
            if not self.scheduler.waiting:  # rows already waiting for room keep it: no prefetch takes it
                thoughts = [stop.params.max_new_tokens for stop in job.stops]
                work = [(node, t) for (node, _), t in zip(job.requests, thoughts, strict=True)]
                self.memory.prefetch(work, reserve=self.scheduler.reserve())
            for (node, n), stop in zip(job.requests, job.stops, strict=True):
                params = stop.params
                base = params.seed if params.seed is not None else self.table.tree_seed(node)
                first = 0 if params.seed is not None else node.spawned
                for k in range(n):
                    seed = row_seed(base, node.key, first + k)
                    matcher = job.grammar.matcher(params) if params.constrained else None
                    row = Row(node, self.table.next_id(), len(job.rows), seed, job=job, stop=stop, matcher=matcher)
                    job.rows.append(row)
                node.spawned += n
        self.jobs.append(job)
        self.scheduler.enqueue(job.rows)
        self._progress = True

    def _step(self) -> None:
        """schedule -> run -> postprocess, for every row in flight: the scheduler's plan (an
        expansion that can never fit fails first, and the next plan is asked for), carried out by
        the executor; then one forward for the running rows."""
        plan = self.scheduler.schedule()
        while plan.failed is not None:
            self._fail(plan.failed, plan.error)
            plan = self.scheduler.schedule()
        if self.executor.step(plan):
            self._progress = True
        if not self.running:
            return
        self._rehydrate_wanted()
        # a window scores prefills only; arbor's rows are scored only within one thought of its floor
        stats = self.memory.planner.decode_statistics([(r.owner, r.stop.params.max_new_tokens) for r in self.running])
        batch, ids, pos = decode_batch(self.store, self.running, stats, self.backend.kernel, self._layout)
        start = time.perf_counter()
        logits = self.backend.forward(batch, ids, pos)[:, -1]  # (R, V)
        if any(r.fed == 0 for r in self.running) and self._rehydrate_wanted():
            # a row's first decode step was a probe: what its retrieval wanted is back, run it again
            batch, ids, pos = decode_batch(self.store, self.running, stats, self.backend.kernel, self._layout)
            logits = self.backend.forward(batch, ids, pos)[:, -1]
        self._charge_step(time.perf_counter() - start)
        self._progress = True
        self.runner.take_attention(batch)
        add_own_attention(self.running, batch)
        finished = []
        for stop, idx in rows_by_stop(self.running).items():
            mine = logits if len(idx) == len(self.running) else logits[idx]  # one request: no (R, V) copy
            finished += postprocess([self.running[i] for i in idx], mine, stop.params, stop)
        for row in finished:
            self.running.remove(row)
            self._finish_row(row)

    def _rehydrate_wanted(self) -> int:
        """On-demand rehydration (a sparse policy's ``rehydrate=ranked``): the evicted chunks of the
        running paths that the last step's retrieval wanted come back, most wanted first, into room
        the running rows will not need (:meth:`Scheduler.reserve`). Returns the tokens restored. A
        step in which a row decodes its first token runs twice when anything came back: the first
        pass only asks what the row's queries want."""
        sparse = self.backend.sparse
        if sparse is None or not sparse.on_demand:
            return 0
        paths = {n.id for r in self.running for n in r.owner.kv_path()}
        wants = [(block_id, idx) for block_id, idx in sparse.wanted() if block_id in paths]
        if not wants:
            return 0
        with self.accounts.accounting(self.running[0].job):
            return self.memory.restore_ranked(wants, reserve=self.scheduler.reserve())

    def _finish_row(self, row: Row) -> None:
        job = row.job
        with self.accounts.accounting(job):
            job.children[row.order] = self.prefiller.child_from_row(row)
        if len(job.children) == len(job.rows):
            self._complete(job)

    def _complete(self, job: ExpandJob) -> None:
        self.jobs.remove(job)
        children = [job.children[i] for i in range(len(job.rows))]
        self.table.order(children)
        out, k = [], 0
        for _, n in job.requests:
            out.append(children[k : k + n])
            k += n
        with self.accounts.accounting(job):
            self.memory.after([node for node, _ in job.requests], children, running=self.scheduler.owners())
        requests = [[n.id, k] for n, k in job.requests]
        self.oplog.append({"op": "expand", "requests": requests, "children": [[c.id for c in kids] for kids in out]})
        job.result = out
        self._end(job)

    def cancel_below(self, node_ids: set[int], error: BaseException) -> None:
        """Fail, with ``error``, every expansion in flight that expands a node of ``node_ids`` (a
        subtree about to be released): its rows leave before their blocks do; others go on."""
        for job in list(self.jobs):
            if any(node.id in node_ids for node, _ in job.requests):
                self._fail(job, error)

    def _fail(self, job: ExpandJob, error: BaseException) -> None:
        """An expansion that cannot finish: its rows leave, its finished children go as if never
        made (as a failed prefill's node does: out of the store, the memory manager's active set and
        frontier, the node tables and the counts of the job's account)."""
        for row in self.scheduler.drop(job):
            self.runner.free_slots(row.extents)
        with self.accounts.accounting(job):  # the children were counted there when they finished
            for child in job.children.values():
                if not child.released:
                    self.memory.forget(self.table.forget_subtree(child, self.accounts.targets()))
                self.table.discard(child, self.accounts.targets())
        if job in self.jobs:
            self.jobs.remove(job)
        job.error = error
        self._end(job)

    # ---- accounting ----------------------------------------------------------------------
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
        for metrics in [self.metrics] + [a.metrics for a in accounts.values()]:
            metrics.decode_steps += 1
            metrics.decode_step_rows += len(self.running)


#: seconds an idle driver (only searches without the turn have work) waits for new work before it looks again
IDLE_POLL = 0.02


def first_page_of(stop: StopChecker) -> int:
    """Slots a row sampled under ``stop`` starts with."""
    return min(PAGE, stop.params.max_new_tokens)
