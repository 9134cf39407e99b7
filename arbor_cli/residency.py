"""Where every block's KV lived over a search: per-block residency deltas, one ``residency.jsonl`` line per problem.

The runtime's per-step trace holds totals only; the viewer (:mod:`arbor_cli.view`) colours each
block by its residency at every step. :class:`ResidencyRecorder` listens to the runtime's step
hook (called once per operation, after its trace point): it reads which blocks the store's journal
says changed during the operation, reads their residency with ``Runtime.residency`` and keeps the
difference from what it saw last. A line of ``residency.jsonl``::

    {"index": 900, "fields": ["step", "node", "device", "host", "dropped", "op", "event"],
     "deltas": [[0, 0, 137, 0, 0, "put", 0], [16, 7, -12, 12, 0, "evict", 31], ...],
     "event_steps": [0, 1, 1, ...]}

- ``deltas``: one row per block and operation that changed it: the trace step (``traces.jsonl``'s
  ``step``), the block (node id), the change in device / host / dropped tokens, the store ops
  behind it ("put", "evict", "drop", "rehydrate", "recompute", "extend", "drop_host", "release";
  several joined by "+") and the ``seq`` of the first event (``events.jsonl``) the operation
  logged after the change (an eviction's is the event whose policy plan made it), or -1 (none
  came after it: a release).
- ``event_steps``: the trace step of each event of ``events.jsonl`` (by ``seq``).

Summing a block's deltas up to a step gives its residency then; summing every block's device and
host deltas gives the trace's ``resident_tokens`` and ``host_tokens`` at that step (a fresh
runtime per problem; in a runtime that several searches share, a problem's line holds its own
tree's blocks while the trace's totals are the runtime's).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from arbor_runtime import Runtime
from arbor_runtime.metrics import TracePoint

RESIDENCY_FILE = "residency.jsonl"
FIELDS = ("step", "node", "device", "host", "dropped", "op", "event")


class ResidencyRecorder:
    """Records per-block residency deltas of one search while attached to its runtime.

    Args:
        rt: the runtime the search runs in.
        account: the search's account in a runtime several searches share (its events are
            numbered by that account's log); None for a runtime of its own.
    """

    def __init__(self, rt: Runtime, account: Any = None) -> None:
        self.rt, self.account = rt, account
        self.deltas: list[list[Any]] = []
        self.event_steps: list[int] = []
        self._seen: dict[int, tuple[int, int, int]] = {}  # block -> (device, host, dropped) last recorded
        self._journal_at = len(rt.store.journal)
        self._events_at = len(rt.events.records)
        self._own_at = len(account.events.records) if account is not None else 0
        rt.step_hooks.append(self.on_step)

    def close(self) -> None:
        """Stop listening (a shared runtime goes on serving other searches)."""
        if self.on_step in self.rt.step_hooks:
            self.rt.step_hooks.remove(self.on_step)

    def __enter__(self) -> ResidencyRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the hook --------------------------------------------------------------------------
    def on_step(self, point: TracePoint, account: Any = None) -> None:
        """One operation ended (``point``): record the blocks its journal entries changed."""
        journal, start = self.rt.store.journal, self._journal_at
        entries, self._journal_at = journal[start:], len(journal)
        events = self._new_events(point.step)
        ops: dict[int, list[str]] = {}
        causes: dict[int, int] = {}
        for j, (op, block, _, _) in enumerate(entries, start=start):
            if op not in ops.setdefault(block, []):
                ops[block].append(op)
            cause = next((seq for seq, journal_len in events if journal_len > j), -1)
            if causes.get(block, -1) < 0:
                causes[block] = cause
        for block, block_ops in ops.items():
            self._record(point.step, block, "+".join(block_ops), causes[block])

    def _record(self, step: int, block: int, op: str, cause: int) -> None:
        node = self.rt.all_nodes.get(block)
        if node is None:  # a block whose operation failed: gone as if never created
            return
        kv = self.rt.residency(node)
        now = (kv["device"], kv["host"], kv["dropped"])
        before = self._seen.get(block, (0, 0, 0))
        change = [a - b for a, b in zip(now, before, strict=True)]
        if any(change) or "release" in op or block not in self._seen:
            self.deltas.append([step, block, *change, op, cause])
            self._seen[block] = now

    def _new_events(self, step: int) -> list[tuple[int, int]]:
        """This search's events logged since the last operation: (seq in its log, journal length)."""
        records = self.rt.events.records
        new, self._events_at = records[self._events_at :], len(records)
        if self.account is None:
            first = len(self.event_steps)
            self.event_steps.extend([step] * len(new))
            return [(first + i, r.journal_len) for i, r in enumerate(new)]
        own = self.account.events.records  # a subsequence of the runtime's log: match its twins in order
        out = []
        for rec in new:
            if self._own_at < len(own) and _twin(own[self._own_at], rec):
                out.append((self._own_at, rec.journal_len))
                self.event_steps.append(step)
                self._own_at += 1
        return out

    # ---- the record ------------------------------------------------------------------------
    def record(self, index: int, tree_ids: Iterable[int] | None = None) -> dict[str, Any]:
        """The ``residency.jsonl`` line of problem ``index``: every block's deltas, or only those of
        the trees ``tree_ids`` (a search in a shared runtime)."""
        deltas = self.deltas
        if tree_ids is not None:
            keep = set(tree_ids)
            nodes = self.rt.all_nodes
            deltas = [d for d in deltas if d[1] in nodes and nodes[d[1]].tree_id in keep]
        return {"index": index, "fields": list(FIELDS), "deltas": deltas, "event_steps": list(self.event_steps)}


def _twin(own: Any, rec: Any) -> bool:
    return (own.kind, own.step, own.journal_len, own.data) == (rec.kind, rec.step, rec.journal_len, rec.data)


# ---- reading it back -----------------------------------------------------------------------
def replay(record: dict[str, Any], steps: Sequence[int]) -> list[dict[int, tuple[int, int, int]]]:
    """Every block's (device, host, dropped) tokens after each of ``steps`` (trace steps, ascending),
    from a ``residency.jsonl`` line: deltas of steps <= that step, summed per block."""
    deltas = sorted(record["deltas"], key=lambda d: d[0])  # stable: same-step rows keep their order
    out, state, at = [], {}, 0
    for step in steps:
        while at < len(deltas) and deltas[at][0] <= step:
            _, block, dev, host, dropped = deltas[at][:5]
            d0, h0, x0 = state.get(block, (0, 0, 0))
            state[block] = (d0 + dev, h0 + host, x0 + dropped)
            at += 1
        out.append(dict(state))
    return out


def totals(states: dict[int, tuple[int, int, int]]) -> tuple[int, int]:
    """(device, host) tokens over all blocks of one replayed step."""
    return sum(s[0] for s in states.values()), sum(s[1] for s in states.values())
