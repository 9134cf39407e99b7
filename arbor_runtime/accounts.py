"""Accounts: where a runtime's counts go, and the trace point each operation leaves.

Every count (tokens, nodes, store movements, time, peaks) goes to the runtime's own
:class:`~arbor_runtime.metrics.RuntimeMetrics` and, when the work being carried out belongs to an
:class:`~arbor_runtime.engine.Account` (one search among several in one runtime), to that
account's metrics too. A thread opens an account with :meth:`Accounts.account`; the engine's
driver marks the work it is carrying out with :meth:`Accounts.accounting`; :meth:`Accounts.start`
puts a work in flight, :meth:`Accounts.note_peak` counts the pool in use toward every work in
flight, and :meth:`Accounts.end` closes a work: its time and peak, the runtime totals synced from
the store and the backend, one :class:`~arbor_runtime.metrics.TracePoint` for the trace and the
step hooks.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from arbor_runtime.engine.work import Account, Work
from arbor_runtime.kv.windows import window_dead_bytes
from arbor_runtime.metrics import MEMORY_SECONDS, RuntimeMetrics, TracePoint, store_totals

if TYPE_CHECKING:
    from arbor_runtime.backend import ModelBackend
    from arbor_runtime.kv import KVStore
    from arbor_runtime.memory import MemoryManager

StepHook = Callable[[TracePoint, Account | None], None]


class Accounts:
    """The runtime's metrics, each thread's account and the work being carried out (driver only).

    Args:
        metrics: the runtime's totals (every work, every account).
        store, memory, backend: what a closing work's totals are read from (and ``memory.account``,
            set to the account of the work being carried out, is where its events go).
        step_hooks: called with (trace point, account or None) after every work; the list is the
            caller's (hooks may be added later).
    """

    def __init__(
        self,
        metrics: RuntimeMetrics,
        store: KVStore,
        memory: MemoryManager,
        backend: ModelBackend,
        step_hooks: list[StepHook],
    ) -> None:
        self.metrics, self.store, self.memory, self.backend = metrics, store, memory, backend
        self.step_hooks = step_hooks
        self.work: Work | None = None  # the work being carried out (driver only)
        self.in_flight: list[Work] = []  # started, not done (their memory peaks are tracked)
        self._local = threading.local()  # .account: the calling thread's account
        self._t0 = time.perf_counter()

    def __deepcopy__(self, memo: dict) -> Accounts:
        """A copy of the totals (through ``memo``: the runtime copy's metrics, store, ...); no work in
        flight and no thread's account carry over."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            if name not in ("work", "_local", "in_flight"):
                setattr(clone, name, copy.deepcopy(value, memo))
        clone.work, clone._local, clone.in_flight = None, threading.local(), []
        return clone

    def current(self) -> Account | None:
        """The calling thread's account (None outside :meth:`account`)."""
        return getattr(self._local, "account", None)

    @contextmanager
    def account(self, account: Account | None = None) -> Iterator[Account]:
        """Count this thread's calls in ``account`` (a new one by default) while inside."""
        account = account or Account()
        previous = getattr(self._local, "account", None)
        self._local.account, account.closed = account, False
        try:
            yield account
        finally:
            self._local.account = previous
            account.closed = True  # its search is over: the engine's turns let the next one in

    def targets(self, work: Work | None = None) -> list[RuntimeMetrics]:
        """The metrics a work's counts go to: the runtime's, and its account's when it has one."""
        work = work or self.work
        acc = work.account if work is not None else None
        return [self.metrics] if acc is None else [self.metrics, acc.metrics]

    @contextmanager
    def accounting(self, work: Work) -> Iterator[None]:
        """Attribute what happens inside (store movements, events, counts) to ``work``."""
        before, previous = store_totals(self.store), self.work
        seconds = dict(self.memory.seconds)
        self.work, self.memory.account = work, work.account
        try:
            yield
        finally:
            self.work, self.memory.account = previous, previous.account if previous is not None else None
            if work.account is not None:
                work.account.metrics.add_store_delta(before, store_totals(self.store))
                for key, name in MEMORY_SECONDS.items():
                    m = work.account.metrics
                    setattr(m, name, getattr(m, name) + self.memory.seconds[key] - seconds[key])

    def start(self, work: Work) -> None:
        """``work`` is in flight (again, when it waited): its peak counts from the pool in use now."""
        if work not in self.in_flight:
            self.in_flight.append(work)
            work.peak = self.store.pool.used

    def note_peak(self) -> None:
        """Pool slots in use now count toward the peak of every work in flight."""
        used = self.store.pool.used
        for work in self.in_flight:
            work.peak = max(work.peak, used)

    def end(self, work: Work) -> None:
        """A work is over (out of flight): its time, the pool peak while it ran, a trace point
        (runtime and account)."""
        self.in_flight.remove(work)
        pool = self.store.pool
        seconds = time.perf_counter() - work.started
        peak = max(work.peak, pool.used)
        bpt = self.backend.shape.bytes_per_token
        if work.account is not None:
            work.account.metrics.runtime_seconds += seconds
            work.account.metrics.note_peak(peak, bpt)
            work.account.metrics.pool_bytes = pool.nbytes
        m = self.metrics
        m.runtime_seconds += seconds
        m.note_peak(pool.peak_used, bpt)
        m.pool_bytes = pool.nbytes
        m.forward_calls, m.model_seconds = self.backend.forward_calls, self.backend.model_seconds
        m.sync_store(self.store, self.memory.events)
        m.floor_tokens = self.memory.planner.largest_lone_need
        for key, name in MEMORY_SECONDS.items():
            setattr(m, name, self.memory.seconds[key])
        if self.backend.sparse is not None:
            m.sync_sparse(self.backend.sparse.stats)
        if work.account is not None:
            work.account.metrics.sync_events(work.account.events)
        dead = self.window_dead_bytes()
        m.window_dead_bytes_max = max(m.window_dead_bytes_max, dead)
        point = TracePoint(
            step=len(m.trace),
            op=work.name,
            resident_tokens=self.store.resident_tokens,
            resident_bytes=self.store.resident_bytes,
            peak_tokens=peak,
            t=time.perf_counter() - self._t0,
            host_tokens=self.store.host_tokens,
            events=len(self.memory.events.records),
            rehydrations=self.store.counters.rehydrations,
            branch_switch_events=m.branch_switch_events,
            window_dead_bytes=dead,
        )
        for target in self.targets(work):
            target.trace.append(point)
        for hook in self.step_hooks:
            hook(point, work.account)

    def window_dead_bytes(self) -> int:
        """Device KV bytes the model's sliding-window layers can no longer read (0 without windows):
        what a per-layer pool would free now (arbor_runtime/kv/windows.py)."""
        windows = self.backend.attention.windows
        if not windows:
            return 0
        readers = [([a.id for a in node.kv_path()], node.end_pos) for node in self.memory.nodes.values()]
        return window_dead_bytes(self.store, readers, windows)
