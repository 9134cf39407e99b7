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

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function


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
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("arbor.call"):
            result = fn()
    call = next(e for e in _tree(prof) if e.name == "arbor.call")
    return running_peak(_allocations(call)), result


@dataclass(slots=True)
class ForwardRecord:
    """One metered forward: its batch's shape and what it allocated.

    Attributes:
        rows / q: batch rows and new tokens per row; own: each row's generated tokens read from the
            pool (decode), 0 for a prefill; logits: positions per row whose logits were kept;
            stats: whether attention statistics were collected.
        context: pool slots the batch's rows read (every context token, counted once per group).
        peak_bytes: the most the forward had allocated above its start (set when the meter stops).
    """

    rows: int
    q: int
    own: int
    logits: int
    stats: bool
    context: int
    peak_bytes: int = 0


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
                lambda *a, **k: forward(backend, *a, **k), *args, **kwargs
            )
        else:
            self.backend.forward = lambda *args, **kwargs: self._metered(forward, *args, **kwargs)
        return self

    def __exit__(self, *exc: object) -> None:
        self.backend.forward = self._forward

    def _metered(self, forward, batch, input_ids, position_ids, logits_to_keep: int = 1):
        rows, q = input_ids.shape
        own = 0 if batch.own_slots is None else int(batch.own_slots.shape[1])
        context = sum(p.length for g in batch.groups for p in g.pieces)
        kept = q if logits_to_keep == 0 else min(logits_to_keep, q)
        record = ForwardRecord(rows, q, own, kept, bool(batch.stats), context)
        record.peak_bytes, out = self._measure(lambda: forward(batch, input_ids, position_ids, logits_to_keep))
        with self._lock:
            self.records.append(record)
        return out

    def _measure(self, call: Callable[[], Any]) -> tuple[int, Any]:
        return transient_peak_bytes(call)


class CudaForwardMeter(ForwardMeter):
    """:class:`ForwardMeter` on CUDA, from the caching allocator's own counters: each forward's peak
    ``max_memory_allocated`` above ``memory_allocated`` at its start (the peak statistic is reset
    before each forward; :meth:`max_allocated` keeps the peak over the whole time inside)."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._peak_seen = 0

    def _measure(self, call: Callable[[], Any]) -> tuple[int, Any]:
        torch.cuda.synchronize()
        self._peak_seen = max(self._peak_seen, torch.cuda.max_memory_allocated())
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, out

    def max_allocated(self) -> int:
        """Peak ``max_memory_allocated`` since the meter was made (across its per-forward resets)."""
        return max(self._peak_seen, torch.cuda.max_memory_allocated())
