"""What a call really allocates, from torch's profiler (``profile_memory=True``).

Counters say what the runtime *thinks* it holds; this measures it. Every allocation and free the
profiler records inside the call is summed in time order; the running total's maximum is the
peak transient allocation (memory allocated before the call, such as the KV pool, is not in it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerActivity, profile


def transient_peak_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn`` under the profiler; return (peak bytes allocated above the start, its result).

    CPU allocations only (what this machine has); on CUDA use ``torch.cuda.max_memory_allocated``.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    running = peak = 0
    for event in events:
        running += event.self_cpu_memory_usage
        peak = max(peak, running)
    return peak, result
