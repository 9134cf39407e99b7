"""Copy lanes of the host tier: CUDA side streams ordered by events, or a synchronous stand-in.

Three lanes: ``compute`` (the current stream: the model, and the gathers of evicted tokens),
``offload`` (device -> host copies) and ``restore`` (host -> device copies and their scatter into
the pool). Lanes are ordered only through events: ``record(lane)`` marks the work a lane has
queued so far, ``wait(lane, event)`` makes that lane wait for it *on the device*. Nothing here
blocks the host (no stream or device synchronize), which is what lets a restore run under compute.

Without CUDA, :class:`SyncStreams` takes the same calls and does nothing: every copy has already
happened when it was issued, every event is complete. :class:`RecordingStreams` behaves the same
but logs every lane entry, record, wait and note, and its events never complete on their own, so
every wait the CUDA path would take is taken (tests, and the check script's dry run, read the log).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

LANES = ("compute", "offload", "restore")


class Done:
    """An event that has completed (what every event is when copies run synchronously)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


DONE = Done()


class SyncStreams:
    """Synchronous lanes (CPU): copies run when issued; records return :data:`DONE`; waits are no-ops."""

    #: host-tier memory is pinned (page-locked) only when copies are asynchronous DMA
    pinned = False

    def lane(self, name: str):
        """Context in which the enclosed copies and kernels are queued on lane ``name``."""
        _check(name)
        return nullcontext()

    def record(self, name: str) -> Any:
        """An event marking the work queued on lane ``name`` so far."""
        _check(name)
        return DONE

    def wait(self, name: str, event: Any) -> None:
        """Lane ``name`` waits (on the device) until ``event`` has completed."""
        _check(name)

    def note(self, *what: Any) -> None:
        """Log a step of the host tier (only :class:`RecordingStreams` keeps it)."""

    def restored(self, start: Any, layers: list[Any], nbytes: int) -> None:
        """A restore batch of ``nbytes`` ran on the restore lane from event ``start``; ``layers``:
        its per-layer completion events (the last one ends the batch)."""


@dataclass(slots=True, eq=False)
class Mark:
    """Event of :class:`RecordingStreams`: lane and serial number; never completes on its own.

    A host-side ``synchronize`` is logged as ``("synchronize", lane, serial)``: the runtime's
    paths must never do one (tests look for it); test helpers that read the host tier may.
    """

    lane: str
    serial: int
    sink: list = field(repr=False, default_factory=list)

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        self.sink.append(("synchronize", self.lane, self.serial))


@dataclass(slots=True)
class RecordingStreams(SyncStreams):
    """:class:`SyncStreams` that logs every call as a tuple in :attr:`log`.

    Entries: ``("enter", lane)``, ``("exit", lane)``, ``("record", lane, serial)``,
    ``("wait", lane, event_lane, serial)`` and notes such as ``("put", block_id, tokens)`` or
    ``("restore", block_ids, tokens)``. Its events report not-complete, so every wait is issued.
    """

    log: list[tuple] = field(default_factory=list)
    _serial: int = 0

    @contextmanager
    def lane(self, name: str) -> Iterator[None]:
        _check(name)
        self.log.append(("enter", name))
        try:
            yield
        finally:
            self.log.append(("exit", name))

    def record(self, name: str) -> Mark:
        _check(name)
        self._serial += 1
        self.log.append(("record", name, self._serial))
        return Mark(name, self._serial, self.log)

    def wait(self, name: str, event: Any) -> None:
        _check(name)
        if isinstance(event, Mark):
            self.log.append(("wait", name, event.lane, event.serial))

    def note(self, *what: Any) -> None:
        self.log.append(what)


class CudaStreams:
    """Two side streams (offload, restore) next to the current stream of ``device``.

    Args:
        device: the CUDA device.
        timing: create timing events and keep, per restore batch, its start/end events and, per
            compute wait, the event recorded when compute reached it (for :meth:`overlap`). Off by
            default: timing events cost a little.
    """

    pinned = True

    def __init__(self, device: torch.device, timing: bool = False) -> None:
        self.device = device
        self.timing = timing
        self._side = {"offload": torch.cuda.Stream(device=device), "restore": torch.cuda.Stream(device=device)}
        self._restores: list[tuple[Any, list[Any], int]] = []
        self._waits: list[tuple[Any, Any]] = []

    def stream(self, name: str) -> torch.cuda.Stream:
        _check(name)
        return torch.cuda.current_stream(self.device) if name == "compute" else self._side[name]

    def lane(self, name: str):
        return torch.cuda.stream(self.stream(name))

    def record(self, name: str) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=self.timing)
        event.record(self.stream(name))
        return event

    def wait(self, name: str, event: Any) -> None:
        if isinstance(event, Done):
            return
        if self.timing and name == "compute":
            self._waits.append((self.record("compute"), event))
        self.stream(name).wait_event(event)

    def note(self, *what: Any) -> None:
        return None

    def restored(self, start: Any, layers: list[Any], nbytes: int) -> None:
        if self.timing:
            self._restores.append((start, layers, nbytes))

    def overlap(self) -> dict[str, float]:
        """Restore time, bytes, and how much of it compute did not wait for (timing mode only).

        Synchronizes the device: for reports after a run, never on the restore path. A compute
        wait on a restore event stalls compute from when compute reached it until the event
        completed (zero if the copy was already done); stalls are disjoint on the compute stream,
        so ``exposed`` is their sum and ``hidden_share = 1 - exposed / restore``.
        """
        torch.cuda.synchronize(self.device)
        restore_ms = sum(start.elapsed_time(layers[-1]) for start, layers, _ in self._restores)
        restore_events = {id(ev) for _, layers, _ in self._restores for ev in layers}
        exposed_ms = sum(
            max(0.0, reached.elapsed_time(event)) for reached, event in self._waits if id(event) in restore_events
        )
        return {
            "restore_seconds": restore_ms / 1e3,
            "restore_bytes": float(sum(n for _, _, n in self._restores)),
            "exposed_seconds": exposed_ms / 1e3,
            "hidden_share": (1.0 - min(exposed_ms, restore_ms) / restore_ms) if restore_ms > 0 else float("nan"),
        }


def default_streams(device: torch.device) -> SyncStreams | CudaStreams:
    """CUDA side streams on a CUDA device, synchronous lanes anywhere else."""
    return CudaStreams(device) if device.type == "cuda" else SyncStreams()


def _check(name: str) -> None:
    if name not in LANES:
        raise ValueError(f"unknown lane {name!r}; lanes are {', '.join(LANES)}")
