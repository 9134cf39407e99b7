"""What a call really allocates, as the allocator reports it to torch's profiler (``profile_memory=True``).

Counters say what the runtime *thinks* it holds; this measures it. With memory profiling on, torch's
CPU allocator reports every allocation and free (its pointer, size, and the running total it has
handed out) as an event of the profiler's trace; that includes buffers a kernel allocates and frees
inside itself. The running sum of those events, in time order, is what was allocated above the
start of the measurement at each moment; its maximum is the peak transient allocation. Memory
allocated before the measurement (the model, the KV pool) is not in it, and its frees are not
reported either.

:class:`ForwardMeter` does this for every forward of a runtime, each forward on its own: the peak
its allocations reached above what was allocated when it began, with the batch's shape (rows, new
tokens, own tokens), so a test can hold each forward to :func:`arbor_runtime.scratch.forward_scratch_bytes`.
On CUDA use ``torch.cuda.max_memory_allocated`` around the step instead (``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

#: the profiler range the output layer runs under while a :class:`ForwardMeter` meters a forward
LOGITS_MARK = "arbor.logits"


def _tree(prof: profile) -> Iterator[Any]:
    """Every event of a finished profile, parents before their children."""
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        yield event
        stack.extend(event.children)


def _allocations(event: Any) -> list[tuple[int, int]]:
    """(time ns, bytes: + allocated, - freed) of every allocator event under ``event``, in time order."""
    found, stack = [], [event]
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation:
            found.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    return sorted(found)


def running_peak(allocations: list[tuple[int, int]]) -> int:
    """Largest running sum of (time, bytes) allocator events: the peak above their start."""
    running = peak = 0
    for _, nbytes in allocations:
        running += nbytes
        peak = max(peak, running)
    return peak


def transient_peak_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn`` under the profiler; return (peak bytes allocated above the start, its result).

    CPU allocations only (what this machine has); on CUDA use ``torch.cuda.max_memory_allocated``.
    """
    peak, _, result = peaks_around(fn, mark=None)
    return peak, result


def peaks_around(fn: Callable[[], Any], mark: str | None) -> tuple[int, int | None, Any]:
    """Run ``fn`` under the profiler; return (its peak above the start, its peak before the first
    ``record_function(mark)`` inside it began (None without one), its result)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("arbor.call"):
            result = fn()
    events = list(_tree(prof))
    call = next(e for e in events if e.name == "arbor.call")
    allocations = _allocations(call)
    starts = [e.start_time_ns for e in events if mark is not None and e.name == mark]
    before = running_peak([a for a in allocations if a[0] < min(starts)]) if starts else None
    return running_peak(allocations), before, result


@contextlib.contextmanager
def marked(module: torch.nn.Module, name: str) -> Iterator[None]:
    """Inside, every call of ``module`` runs under ``record_function(name)`` (its start is visible to
    :func:`peaks_around`); its own ``forward`` is put back afterwards."""
    own = module.__dict__.get("forward")  # an instance's own forward (a hook library's), else the class's
    forward = module.forward

    def wrapped(*args, **kwargs):
        with record_function(name):
            return forward(*args, **kwargs)

    module.forward = wrapped
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


@dataclass(slots=True)
class ForwardRecord:
    """One metered forward: its batch's shape and what it allocated.

    Attributes:
        rows / q: batch rows and new tokens per row; own: each row's generated tokens read from the
            pool (decode), 0 for a prefill; logits: positions per row whose logits were kept;
            stats: whether attention statistics were collected.
        context: pool slots the batch's rows read (every context token, counted once per group).
        peak_bytes: the most the forward had allocated above its start (set when the meter stops).
        body_peak_bytes: the most it had allocated before the output layer made the logits: the layer
            stack's own scratch, attention included (None where the meter cannot tell, on CUDA).
    """

    rows: int
    q: int
    own: int
    logits: int
    stats: bool
    context: int
    peak_bytes: int = 0
    body_peak_bytes: int | None = None


class ForwardMeter:
    """Measures, allocation-true, every forward of a backend while inside ``with``: of one runtime's
    (``ForwardMeter(rt.backend)``) or of every runtime's (``ForwardMeter(ModelBackend)``, for runs
    that build their runtimes themselves, such as ``arbor-solve``'s).

    Each forward runs under a profiler of its own, started in the thread that runs it (with several
    searches in threads, whichever drives the engine), so its record holds its own peak.

    Example::

        with ForwardMeter(rt.backend) as meter:
            rt.expand(root, 8, params)
        worst = max(meter.records, key=lambda r: r.peak_bytes)
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.records: list[ForwardRecord] = []
        self._forward = backend.forward
        self._lock = threading.Lock()

    def __enter__(self) -> ForwardMeter:
        forward = self._forward
        if isinstance(self.backend, type):  # every instance's forward: the wrapper gets ``self`` too
            self.backend.forward = lambda backend, *args, **kwargs: self._metered(
                backend, lambda *a, **k: forward(backend, *a, **k), *args, **kwargs
            )
        else:
            backend = self.backend
            self.backend.forward = lambda *args, **kwargs: self._metered(backend, forward, *args, **kwargs)
        return self

    def __exit__(self, *exc: object) -> None:
        self.backend.forward = self._forward

    def _metered(self, backend, forward, batch, input_ids, position_ids, logits_to_keep: int = 1):
        rows, q = input_ids.shape
        own = 0 if batch.own_slots is None else int(batch.own_slots.shape[1])
        context = sum(p.length for g in batch.groups for p in g.pieces)
        kept = q if logits_to_keep == 0 else min(logits_to_keep, q)
        record = ForwardRecord(rows, q, own, kept, bool(batch.stats), context)
        with marked(backend.model.get_output_embeddings(), LOGITS_MARK):
            record.peak_bytes, record.body_peak_bytes, out = self._measure(
                lambda: forward(batch, input_ids, position_ids, logits_to_keep)
            )
        with self._lock:
            self.records.append(record)
        return out

    def _measure(self, call: Callable[[], Any]) -> tuple[int, int | None, Any]:
        return peaks_around(call, LOGITS_MARK)


class CudaForwardMeter(ForwardMeter):
    """:class:`ForwardMeter` on CUDA, from the caching allocator's own counters: each forward's peak
    ``max_memory_allocated`` above ``memory_allocated`` at its start (the peak statistic is reset
    before each forward; :meth:`max_allocated` keeps the peak over the whole time inside)."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._peak_seen = 0

    def _measure(self, call: Callable[[], Any]) -> tuple[int, int | None, Any]:
        torch.cuda.synchronize()
        self._peak_seen = max(self._peak_seen, torch.cuda.max_memory_allocated())
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, None, out

    def max_allocated(self) -> int:
        """Peak ``max_memory_allocated`` since the meter was made (across its per-forward resets)."""
        return max(self._peak_seen, torch.cuda.max_memory_allocated())
