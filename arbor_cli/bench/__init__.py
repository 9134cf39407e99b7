"""Benchmarks: trace record / replay fidelity, memory-over-steps plots, speed vs naive ToT.

- :mod:`~arbor_cli.bench.trace`: a recorded ``full`` search as JSON (:func:`record_trace`).
- :mod:`~arbor_cli.bench.replay`: teacher-forced replay under any policy and budget, in lockstep
  with full (:func:`replay_trace`, :func:`compare_policies`).
- :mod:`~arbor_cli.bench.plots`: resident device KV per step (:func:`memory_panels`, :func:`plot_memory`).
- :mod:`~arbor_cli.bench.speed`: the same tree built by the runtime, naively, with a prefix cache.

Entry points: ``scripts/record_trace.py``, ``scripts/replay_trace.py``, ``scripts/plot_memory.py``,
``scripts/bench_speed.py``.
"""

from arbor_cli.bench.plots import memory_panels, memory_series, plot_memory
from arbor_cli.bench.replay import (
    DEFAULT_FRACTIONS,
    DEFAULT_POLICIES,
    Fidelity,
    ReplayRun,
    budgets_for,
    compare_policies,
    replay_lockstep,
    replay_trace,
)
from arbor_cli.bench.speed import expected_prefill_tokens, speed_compare
from arbor_cli.bench.trace import Trace, TraceNode, load_trace, record_trace

__all__ = [
    "DEFAULT_FRACTIONS",
    "DEFAULT_POLICIES",
    "Fidelity",
    "ReplayRun",
    "Trace",
    "TraceNode",
    "budgets_for",
    "compare_policies",
    "expected_prefill_tokens",
    "load_trace",
    "memory_panels",
    "memory_series",
    "plot_memory",
    "record_trace",
    "replay_lockstep",
    "replay_trace",
    "speed_compare",
]
