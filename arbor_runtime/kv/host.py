"""Host tier: evicted KV spans, per block, with async copies when CUDA is present.

With CUDA, spans live in pinned host memory and both directions are copied on a dedicated
stream; each copy records an event, the compute stream waits on that event (never on a global
synchronize), and the source tensor is held until the event is acknowledged. Without CUDA the
same calls run synchronously on the CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class HostSpan:
    """Evicted tokens of one block: idx (E,) sorted block-local indices, keys/values (L, H_kv, E, D)."""

    idx: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.idx.numel())


class HostTier:
    """Block id -> :class:`HostSpan`; counts bytes moved each way and transfer time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self._spans: dict[int, HostSpan] = {}
        self._in_flight: list[tuple[torch.cuda.Event, torch.Tensor]] = []
        self.tokens = 0
        self.bytes_to_host = 0
        self.bytes_to_device = 0
        self.transfer_seconds = 0.0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._spans

    def indices(self, block_id: int) -> torch.Tensor | None:
        span = self._spans.get(block_id)
        return None if span is None else span.idx

    def put(self, block_id: int, idx: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Offload tokens ``idx`` of a block (merged with what the block already has here)."""
        start = time.perf_counter()
        hk, hv = self._to_host(keys), self._to_host(values)
        self.bytes_to_host += _nbytes(keys) + _nbytes(values)
        old = self._spans.get(block_id)
        if old is not None:
            idx, hk, hv = _merge(old.idx, old.keys, old.values, idx.cpu(), hk, hv)
        self._spans[block_id] = HostSpan(idx.cpu(), hk, hv)
        self.tokens += int(keys.shape[2])
        self.transfer_seconds += time.perf_counter() - start

    def take(self, block_id: int, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring tokens ``idx`` (subset of the block's host indices) back to the device.

        Returns keys, values (L, H_kv, len(idx), D) on the device, bit-identical to what was put.
        """
        start = time.perf_counter()
        span = self._spans[block_id]
        sel = torch.isin(span.idx, idx.cpu())
        keys, values = self._to_device(span.keys[:, :, sel]), self._to_device(span.values[:, :, sel])
        self.bytes_to_device += _nbytes(keys) + _nbytes(values)
        rest = ~sel
        if bool(rest.any()):
            self._spans[block_id] = HostSpan(span.idx[rest], span.keys[:, :, rest], span.values[:, :, rest])
        else:
            del self._spans[block_id]
        self.tokens -= int(sel.sum())
        self.transfer_seconds += time.perf_counter() - start
        return keys, values

    def drop(self, block_id: int) -> int:
        """Forget a block's host span; returns the tokens dropped."""
        span = self._spans.pop(block_id, None)
        if span is None:
            return 0
        self.tokens -= span.tokens
        return span.tokens

    def forget(self, block_id: int, idx: torch.Tensor) -> int:
        """Forget tokens ``idx`` of a block's span (they were rebuilt on the device); returns how many."""
        span = self._spans.get(block_id)
        if span is None:
            return 0
        gone = torch.isin(span.idx, idx.cpu())
        n = int(gone.sum())
        if n == span.tokens:
            del self._spans[block_id]
        elif n:
            rest = ~gone
            self._spans[block_id] = HostSpan(span.idx[rest], span.keys[:, :, rest], span.values[:, :, rest])
        self.tokens -= n
        return n

    def nbytes(self) -> int:
        return sum(_nbytes(s.keys) + _nbytes(s.values) for s in self._spans.values())

    # ---- copies ---------------------------------------------------------------------------
    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        if not self.cuda:
            return t.detach().clone()
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out.copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self._in_flight.append((event, t))  # keep the source alive until the copy is acknowledged
        self._reap()
        return out

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if not self.cuda:
            return t.clone()
        self._wait_all()  # host data must be complete before it is read back
        with torch.cuda.stream(self.stream):
            out = t.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        torch.cuda.current_stream(self.device).wait_event(event)
        out.record_stream(torch.cuda.current_stream(self.device))
        return out

    def _reap(self) -> None:
        self._in_flight = [(e, t) for e, t in self._in_flight if not e.query()]

    def _wait_all(self) -> None:
        for event, _ in self._in_flight:
            event.synchronize()
        self._in_flight.clear()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _merge(idx_a, k_a, v_a, idx_b, k_b, v_b):
    """Union of two spans, sorted by index. Shapes as in :class:`HostSpan`."""
    idx = torch.cat([idx_a, idx_b])
    order = torch.argsort(idx)
    return idx[order], torch.cat([k_a, k_b], dim=2)[:, :, order], torch.cat([v_a, v_b], dim=2)[:, :, order]
