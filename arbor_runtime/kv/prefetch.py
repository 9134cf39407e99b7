"""Prefetched restores: the admission plan's host spans start copying before the step's forward,
and compute waits for them per block and per layer, on the device, never on the host.

The store queues each restore it plans (:meth:`Prefetcher.add`: host slots -> freshly allocated
pool slots); the memory manager issues the queue once its plan is complete
(:meth:`Prefetcher.issue`), before the runtime runs the step. The host tier copies a batch layer
by layer on the restore lane and returns one event per layer; the batch becomes a
:class:`Ticket` (the pool slots it writes, its events).

Reads of those slots go through :class:`FencedPool`: attention reading layer ``l`` of a block
segment makes compute wait for layer ``l`` of the tickets writing into that segment (so layer 0
can start while later layers are still copying); a read of every layer (eviction, compaction)
or a free waits for the whole ticket. A read of slots whose restore is still queued issues the
queue first. Once compute has waited on every layer of a ticket, or its last event completed,
the ticket is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from arbor_runtime.kv.host import HostTier, Restore, slot_runs
from arbor_runtime.kv.pool import DevicePool, Extent


@dataclass(slots=True)
class Ticket:
    """An issued restore batch: the pool slot ranges it writes, one event per layer, and which
    layers compute has already waited for."""

    ranges: list[tuple[int, int]]
    events: list[Any]
    waited: list[bool]
    blocks: list[int]

    def overlaps(self, lo: int, hi: int) -> bool:
        return any(s < hi and lo < e for s, e in self.ranges)


class Prefetcher:
    """Queue of planned restores and the tickets of issued ones (see module docstring)."""

    def __init__(self, host: HostTier) -> None:
        self.host = host
        self.pool: DevicePool | None = None  # set by the FencedPool it guards
        self.queued: list[Restore] = []
        self.tickets: list[Ticket] = []
        self.issued_batches = 0

    @property
    def streams(self):
        return self.host.streams

    @property
    def busy(self) -> bool:
        """Restores are queued or in flight (reads may have to wait)."""
        return bool(self.queued or self.tickets)

    def add(self, restore: Restore) -> None:
        """Plan a restore (its ``device_slots`` already allocated); copies start at :meth:`issue`."""
        self.queued.append(restore)

    def issue(self) -> None:
        """Start every queued restore on the restore lane (one batch, layer by layer)."""
        if not self.queued:
            return
        batch, self.queued = self.queued, []
        events = self.host.restore(self.pool, batch)
        slots = torch.cat([r.device_slots for r in batch])
        self.issued_batches += 1
        self._reap()
        if not events[-1].query():
            ranges = slot_runs(slots)
            self.tickets.append(Ticket(ranges, events, [False] * len(events), [r.block_id for r in batch]))

    def wait(self, layer: int, lo: int, hi: int) -> None:
        """Compute is about to read layer ``layer`` of pool slots [lo, hi): wait for restores into them."""
        if not self.busy:
            return
        self._issue_if(lambda r: _hits(r.device_slots, lo, hi))
        for ticket in [t for t in self.tickets if t.overlaps(lo, hi)]:
            if not ticket.waited[layer]:
                self.streams.wait("compute", ticket.events[layer])
                ticket.waited[layer] = True
            if all(ticket.waited):
                self.tickets.remove(ticket)

    def settle(self, slots: torch.Tensor) -> None:
        """Compute is about to read every layer of ``slots`` (N,), or to free them: wait for their
        restores to finish (the last layer's event covers the batch: the restore lane is in order)."""
        if not self.busy:
            return
        if slots.device.type != "cpu":  # not inspectable without a sync: settle everything
            self.issue()
            runs = [(0, 1 << 62)]
        else:
            runs = slot_runs(slots)
            self._issue_if(lambda r: any(_hits(r.device_slots, s, e) for s, e in runs))
        for ticket in [t for t in self.tickets if any(t.overlaps(s, e) for s, e in runs)]:
            self.streams.wait("compute", ticket.events[-1])
            self.tickets.remove(ticket)

    def _issue_if(self, hit) -> None:
        if any(hit(r) for r in self.queued):
            self.issue()

    def _reap(self) -> None:
        self.tickets = [t for t in self.tickets if not t.events[-1].query()]


class FencedPool(DevicePool):
    """The device pool, whose reads and frees first wait for restores in flight into their slots.

    Row slots (``gather_layer``, ``write_layer``) are never restore targets and are not fenced;
    context slots read as one packed copy (``gather_runs``) are, run by run.
    """

    def __init__(self, shape, capacity: int, fixed: bool, prefetcher: Prefetcher) -> None:
        super().__init__(shape, capacity, fixed)
        self.prefetcher = prefetcher
        prefetcher.pool = self

    def layer_view(self, layer: int, ext: Extent) -> tuple[torch.Tensor, torch.Tensor]:
        self.prefetcher.wait(layer, ext.start, ext.end)
        return super().layer_view(layer, ext)

    def gather_runs(self, layer: int, slots: torch.Tensor, runs) -> tuple[torch.Tensor, torch.Tensor]:
        for lo, hi in runs:
            self.prefetcher.wait(layer, lo, hi)
        return super().gather_runs(layer, slots, runs)

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.prefetcher.settle(slots)
        return super().read(slots)

    def settle(self, slots: torch.Tensor) -> None:
        """Make compute wait for restores into ``slots`` (N,) before it reads them directly."""
        self.prefetcher.settle(slots)

    def free(self, ext: Extent) -> None:
        if ext.length > 0 and self.prefetcher.busy:
            self.prefetcher.settle(torch.arange(ext.start, ext.end))
        super().free(ext)


def _hits(slots: torch.Tensor, lo: int, hi: int) -> bool:
    return bool(((slots >= lo) & (slots < hi)).any())
