"""Trace-replay fidelity of ``arbor`` with and without KVP as its in-block token selector.

A recorded ``full`` search (``scripts/record_trace.py``) is replayed teacher-forced, in lockstep,
under ``arbor`` (tokens inside a block chosen by accumulated attention) and ``arbor`` with
``token_scorer=kvp``, at each budget fraction of the full replay peak; fidelity to the unbounded
replay (top-1 agreement, mean KL) and the memory metrics per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arbor_runtime.loading import LoadedModel
from benchmarks.replay import ReplayRun, budgets_for, replay_lockstep, trace_fields
from benchmarks.trace import Trace

#: row label -> arbor's fields
SELECTORS: dict[str, dict[str, Any]] = {"arbor": {}, "arbor+kvp": {"token_scorer": "kvp"}}


def selector_replay(loaded: LoadedModel, trace: Trace, fractions: Sequence[float]) -> list[dict[str, Any]]:
    """One row per (selector, budget fraction): replay fidelity and memory, labelled by selector."""
    budgets = budgets_for(trace, fractions)
    labels, runs = [], []
    for label, kwargs in SELECTORS.items():
        for fraction, budget in budgets.items():
            labels.append(label)
            runs.append(ReplayRun("arbor", budget, fraction, dict(kwargs)))
    _, *done = replay_lockstep(loaded, trace, runs)
    return [trace_fields(trace) | run.row() | {"policy": label} for label, run in zip(labels, done, strict=True)]
