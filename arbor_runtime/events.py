"""Events: the only triggers of memory-policy action, logged so a run can be replayed and plotted.

- ``NodeEnd``: a child's generation (or a forced block) finished.
- ``BranchSwitch``: the next expansion is not on the current active path.
- ``MemoryThreshold``: resident KV passed ``threshold * budget``, or the next operation needs
  room (``needed`` > 0) that the budget does not have.

Every record carries the step, a timestamp, and the resident/host totals after the policy acted,
plus the length of the store's journal at that point, so :func:`replay_resident` can rebuild
the totals from the journal alone and check them against the log.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeEnd:
    node_id: int
    kind = "node_end"


@dataclass(frozen=True, slots=True)
class BranchSwitch:
    from_node: int | None
    to_nodes: tuple[int, ...]
    kind = "branch_switch"


@dataclass(frozen=True, slots=True)
class MemoryThreshold:
    resident_tokens: int
    budget_tokens: int
    needed: int = 0
    kind = "memory_threshold"


Event = NodeEnd | BranchSwitch | MemoryThreshold


@dataclass(slots=True)
class EventRecord:
    """One logged event with the memory state after the policy reacted."""

    seq: int
    step: int
    t: float
    kind: str
    data: dict[str, Any]
    resident_tokens: int
    host_tokens: int
    journal_len: int
    plan_blocks: int = 0


@dataclass(slots=True)
class EventLog:
    """Append-only list of :class:`EventRecord` (``arbor-solve`` writes it to events.jsonl)."""

    records: list[EventRecord] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    def add(self, event: Event, step: int, resident: int, host: int, journal_len: int, plan_blocks: int) -> None:
        data = {k: v for k, v in asdict(event).items()}
        rec = EventRecord(
            len(self.records),
            step,
            time.perf_counter() - self.t0,
            event.kind,
            data,
            resident,
            host,
            journal_len,
            plan_blocks,
        )
        self.records.append(rec)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rec in self.records:
            out[rec.kind] = out.get(rec.kind, 0) + 1
        return out


def replay_resident(journal: list[tuple[str, int, int, int]], log: EventLog) -> list[tuple[int, int]]:
    """Rebuild (resident, host) totals at each event from the store journal alone.

    Args:
        journal: the store's (op, block_id, device_delta, host_delta) entries.
    Returns:
        per event record, the replayed (resident_tokens, host_tokens).
    """
    out, resident, host, upto = [], 0, 0, 0
    for rec in log.records:
        for _, _, dev, hst in journal[upto : rec.journal_len]:
            resident, host = resident + dev, host + hst
        upto = rec.journal_len
        out.append((resident, host))
    return out
