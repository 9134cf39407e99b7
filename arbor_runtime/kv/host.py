"""Host tier: evicted KV in a preallocated pool of host token slots, copied on side lanes.

The pool is a list of chunks, each ``(L, C, 2, H_kv, D)`` (layer-major, so one layer of a run of
slots is one contiguous piece of memory: a single DMA each way), pinned when copies are
asynchronous. Chunks are added ``chunk_tokens`` at a time, never past ``capacity`` (the policy's
``host_budget_tokens``). A block's evicted tokens are a :class:`HostSpan`: its block-local
indices and the host slots holding them. Merging a later eviction into a span, or restoring part
of one, moves those indices around; the K/V in the slots never move on the host.

Copies (lanes from :mod:`arbor_runtime.kv.streams`):

- offload (:meth:`HostTier.put`): evicted tokens are gathered on the compute lane into one of two
  device staging buffers (bounded, reused), then copied to their host slots on the offload lane;
  compute waits for a buffer's previous copy before filling it again (on the device).
- restore (:meth:`HostTier.restore`): a batch of spans is copied layer by layer on the restore
  lane through a bounded per-layer staging buffer and scattered into its pool slots; one event
  per layer, so attention at layer ``l`` waits for layer ``l`` only (``kv/prefetch.py``).

With CUDA the lanes are side streams and no call blocks the host; without it the same code runs
synchronously on the CPU (no pinning).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from arbor_runtime.kv.freelist import FreeList
from arbor_runtime.kv.pool import DevicePool, Extent, available_host_bytes
from arbor_runtime.kv.streams import DONE, SyncStreams, default_streams

if TYPE_CHECKING:
    from arbor_runtime.kv.shape import KVShape

log = logging.getLogger(__name__)

#: host slots added at a time (bounded by the capacity)
CHUNK_TOKENS = 4096
#: bytes of one device staging buffer (offload: all layers of a few tokens; restore: one layer)
STAGE_BYTES = 16 << 20
#: staging buffers never hold fewer / more tokens than this
STAGE_MIN_TOKENS, STAGE_MAX_TOKENS = 16, 8192


#: share of the host memory available when a runtime starts that its host tier may hold when the
#: policy sets no ``host_budget_tokens`` (the rest stays for the process, the model and other runs)
HOST_SHARE = 0.5


def default_host_tokens(shape: KVShape) -> int:
    """Host slots a tier may hold by default: :data:`HOST_SHARE` of the host memory available now,
    in tokens of this model (``bytes_per_token`` each)."""
    return int(HOST_SHARE * available_host_bytes()) // shape.bytes_per_token


class HostFull(MemoryError):
    """More host slots were asked for than ``capacity`` allows (callers check :meth:`HostTier.room`)."""


# ---- slot accounting ----------------------------------------------------------------------
class HostSlots:
    """Which host token slots are free: pure bookkeeping, no tensors.

    Slots come in chunks of ``chunk`` (the last one smaller if ``limit`` says so), added on demand,
    never past ``limit`` (None: no limit). The chunks are the segments of a
    :class:`~arbor_runtime.kv.freelist.FreeList`: free ranges never cross a chunk; allocation is
    first-fit, split over several ranges when no single one is large enough (so an allocation
    succeeds exactly when enough slots are free or can be added).
    """

    def __init__(self, chunk: int, limit: int | None = None) -> None:
        if chunk < 1:
            raise ValueError(f"chunk={chunk} must be a positive number of slots")
        if limit is not None and limit < 0:
            raise ValueError(f"limit={limit} must be >= 0 or None")
        self.chunk, self.limit = chunk, limit
        self._slots = FreeList("host slots")  # its segments are the chunks

    @property
    def bounds(self) -> list[int]:
        """Chunk i holds slots ``[bounds[i], bounds[i + 1])``."""
        return self._slots.bounds

    @property
    def used(self) -> int:
        return self._slots.used

    @property
    def capacity(self) -> int:
        """Slots in the chunks added so far."""
        return self._slots.capacity

    @property
    def chunks(self) -> int:
        return self._slots.segments

    def room(self) -> int:
        """Slots an allocation can still get (free now plus what chunks may still add)."""
        if self.limit is None:
            return 1 << 62
        return self.limit - self.used

    def free_ranges(self) -> list[Extent]:
        return self._slots.extents()

    def chunk_of(self, slot: int) -> int:
        return self._slots.segment_of(slot)

    def alloc(self, n: int) -> list[Extent]:
        """``n`` slots: one extent when a free range holds them, else several (first ranges first)."""
        if n <= 0:
            return []
        if n > self.room():
            raise HostFull(f"{n} host slots asked, room for {self.room()} (capacity {self.limit})")
        while self.capacity - self.used < n:
            self._add_chunk()
        return self._slots.alloc(n)

    def free(self, slots: torch.Tensor) -> None:
        """Give back ``slots`` (N,) long, any order; merged with free neighbours of the same chunk.

        Raises ValueError for a slot that is not allocated (double free, or never handed out).
        """
        runs = slot_runs(slots, self.bounds)
        self._slots.free(Extent(s, e - s) for s, e in runs)

    # ---- internals ---------------------------------------------------------------------
    def _add_chunk(self) -> None:
        self._slots.grow(self.chunk if self.limit is None else min(self.chunk, self.limit - self.capacity))


def slot_runs(slots: torch.Tensor, bounds: list[int] | None = None) -> list[tuple[int, int]]:
    """Sorted ``slots`` (N,) as maximal ``[start, end)`` runs of consecutive slots (not crossing ``bounds``)."""
    if slots.numel() == 0:
        return []
    s = torch.sort(slots.cpu()).values
    cut = s[1:] != s[:-1] + 1
    if bounds is not None and len(bounds) > 2:
        cut |= torch.isin(s[1:], torch.tensor(bounds[1:-1]))
    ends = torch.nonzero(cut).squeeze(1).tolist()
    first, out = 0, []
    vals = s.tolist()
    for i in [*ends, len(vals) - 1]:
        out.append((vals[first], vals[i] + 1))
        first = i + 1
    return out


def ordered_runs(slots: torch.Tensor, bounds: list[int]) -> list[tuple[int, int, int]]:
    """``slots`` (N,) in their given order as runs ``(first slot, length, offset in slots)``: each
    run is consecutive increasing slots inside one chunk."""
    if slots.numel() == 0:
        return []
    s = slots.cpu()
    cut = s[1:] != s[:-1] + 1
    if len(bounds) > 2:
        cut |= torch.isin(s[1:], torch.tensor(bounds[1:-1]))
    starts = [0, *(torch.nonzero(cut).squeeze(1) + 1).tolist()]
    ends = [*starts[1:], int(s.numel())]
    vals = s.tolist()
    return [(vals[a], b - a, a) for a, b in zip(starts, ends, strict=True)]


# ---- spans and copies ---------------------------------------------------------------------
@dataclass(slots=True)
class HostSpan:
    """Evicted tokens of one block: ``idx`` (E,) sorted block-local indices, ``slots`` (E,) the host
    slot of each; ``writes``: events of the offload copies that filled them (maybe in flight).

    ``heads``: None when every layer and KV head of a slot holds token ``idx[j]``; for the spans of a
    per-head block (``BlockKV.heads``) (L, H_kv, E), the token each layer and KV head holds in each slot
    (``idx`` then names the slots' nominal tokens, as a per-head block's segments do).
    """

    idx: torch.Tensor
    slots: torch.Tensor
    writes: list[Any] = field(default_factory=list)
    heads: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return int(self.idx.numel())


@dataclass(slots=True)
class Restore:
    """One block's tokens ``idx`` (N,) on their way back: host ``slots`` (N,) -> pool ``device_slots`` (N,).

    ``writes``: offload events the restore lane waits for before reading the host slots.
    ``heads``: (L, H_kv, N) the token each layer and KV head holds in each slot (a per-head span), or None.
    """

    block_id: int
    idx: torch.Tensor
    slots: torch.Tensor
    device_slots: torch.Tensor
    writes: list[Any]
    heads: torch.Tensor | None = None


class HostTier:
    """Block id -> :class:`HostSpan` over a pool of host slots; counts bytes moved and copy time.

    Args:
        shape: the model's KV geometry (a host slot holds one token's K and V for every layer).
        capacity: host slots at most (``host_budget_tokens``); None: grows without limit.
        chunk_tokens: slots added at a time.
        streams: copy lanes (default: CUDA side streams on a CUDA device, else synchronous).
    """

    def __init__(
        self,
        shape: KVShape,
        capacity: int | None = None,
        chunk_tokens: int = CHUNK_TOKENS,
        streams: Any = None,
    ) -> None:
        self.shape = shape
        self.streams = streams if streams is not None else default_streams(shape.device)
        self.slots = HostSlots(chunk_tokens, capacity)
        self._chunks: list[torch.Tensor] = []  # (L, C, 2, H_kv, D) each
        self._spans: dict[int, HostSpan] = {}
        self._out: list[torch.Tensor | None] = [None, None]  # offload staging ring (L, n, 2, H_kv, D)
        self._out_done: list[Any] = [DONE, DONE]
        self._next_out = 0
        self._in: torch.Tensor | None = None  # restore staging (n, 2, H_kv, D), one layer at a time
        self._last_restore: Any = DONE
        self.tokens = 0
        self.bytes_to_host = 0
        self.bytes_to_device = 0
        self.transfer_seconds = 0.0  # host time in put / restore (the copies themselves without CUDA)
        self.restore_seconds = 0.0  # of which restore
        per_token = shape.bytes_per_token
        self.out_tokens = _clamp(STAGE_BYTES // per_token)
        self.in_tokens = _clamp(STAGE_BYTES // max(per_token // shape.layers, 1))

    # ---- queries -------------------------------------------------------------------------
    def __contains__(self, block_id: int) -> bool:
        return block_id in self._spans

    def indices(self, block_id: int) -> torch.Tensor | None:
        span = self._spans.get(block_id)
        return None if span is None else span.idx

    def heads(self, block_id: int) -> torch.Tensor | None:
        """(L, H_kv, E) the token each layer and KV head holds in each slot of a per-head span, in
        ``indices`` order; None for a whole-token span (or none)."""
        span = self._spans.get(block_id)
        return None if span is None else span.heads

    def room(self) -> int:
        """Tokens a :meth:`put` can still take."""
        return self.slots.room()

    def nbytes(self) -> int:
        """Bytes of host memory the slot pool holds (all chunks, used or not)."""
        return sum(c.numel() * c.element_size() for c in self._chunks)

    def read(self, block_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(idx (E,), keys, values (L, H_kv, E, D)) of a block's span, on the host; for tests and
        checks only: waits on the host for the span's copies to finish."""
        span = self._spans[block_id]
        for event in span.writes:
            event.synchronize()
        k = torch.empty(
            self.shape.layers, span.tokens, self.shape.kv_heads, self.shape.head_dim, dtype=self.shape.dtype
        )
        v = torch.empty_like(k)
        for slot, n, off in ordered_runs(span.slots, self.slots.bounds):
            chunk, a = self._locate(slot)
            k[:, off : off + n] = chunk[:, a : a + n, 0]
            v[:, off : off + n] = chunk[:, a : a + n, 1]
        return span.idx, k.transpose(1, 2), v.transpose(1, 2)

    # ---- updates -------------------------------------------------------------------------
    def put(
        self, block_id: int, idx: torch.Tensor, pool: DevicePool, src: torch.Tensor, heads: torch.Tensor | None = None
    ) -> None:
        """Offload tokens ``idx`` (N,) of a block from device pool slots ``src`` (N,); ``heads``: (L, H_kv, N)
        what each layer and KV head of those slots holds, for a per-head block (see :class:`HostSpan`).

        The caller made sure those slots hold their final data for every lane (``kv/prefetch.py``)
        and that :meth:`room` is at least N. Merged with the block's span, if it has one.
        """
        n = int(idx.numel())
        if n == 0:
            return
        start = time.perf_counter()
        dst = _extent_slots(self.slots.alloc(n))
        self._grow()
        done = self._copy_out(pool, src.cpu(), dst)
        old = self._spans.get(block_id)
        heads = None if heads is None else heads.cpu().clone()
        if old is None:
            self._spans[block_id] = HostSpan(idx.cpu().clone(), dst, [done], heads)
        else:
            merged_idx = torch.cat([old.idx, idx.cpu()])
            order = torch.argsort(merged_idx)
            merged_heads = None
            if heads is not None or old.heads is not None:
                merged_heads = torch.cat(
                    [_columns(old.heads, old.idx, self.shape), _columns(heads, idx, self.shape)], -1
                )
                merged_heads = merged_heads[..., order]
            self._spans[block_id] = HostSpan(
                merged_idx[order], torch.cat([old.slots, dst])[order], [*_pending(old.writes), done], merged_heads
            )
        self.tokens += n
        self.bytes_to_host += n * self.shape.bytes_per_token
        self.transfer_seconds += time.perf_counter() - start
        self.streams.note("put", block_id, n)

    def take(self, block_id: int, idx: torch.Tensor) -> Restore:
        """Detach tokens ``idx`` (a subset of the block's host indices) from its span for a restore.

        Bookkeeping only: their slots stay allocated until :meth:`restore` has queued the copy.
        Returns a :class:`Restore` (tokens in sorted index order) whose ``device_slots`` the caller
        fills in.
        """
        span = self._spans[block_id]
        sel = torch.isin(span.idx, idx.cpu())
        taken, slots = span.idx[sel], span.slots[sel]
        rest = ~sel
        writes = _pending(span.writes)
        heads = None if span.heads is None else span.heads[..., sel]
        if bool(rest.any()):
            rest_heads = None if span.heads is None else span.heads[..., rest]
            self._spans[block_id] = HostSpan(span.idx[rest], span.slots[rest], writes, rest_heads)
        else:
            del self._spans[block_id]
        self.tokens -= int(slots.numel())
        return Restore(block_id, taken, slots, torch.zeros(0, dtype=torch.long), writes, heads)

    def restore(self, pool: DevicePool, batch: list[Restore]) -> list[Any]:
        """Copy a batch of taken spans into their pool slots on the restore lane, layer by layer.

        Returns one event per layer: layer ``l`` of every token in the batch is in the pool once
        event ``l`` has completed. The host slots are freed (a later offload into them waits for
        this batch on the device).
        """
        streams, layers = self.streams, self.shape.layers
        slots = torch.cat([r.slots for r in batch]) if batch else torch.zeros(0, dtype=torch.long)
        n = int(slots.numel())
        if n == 0:
            return [DONE] * layers
        start_wall = time.perf_counter()
        dst = torch.cat([r.device_slots for r in batch])
        streams.note("restore", [r.block_id for r in batch], n)
        streams.wait("restore", streams.record("compute"))  # its pool slots may have been read until now
        for event in {id(e): e for r in batch for e in r.writes}.values():
            streams.wait("restore", event)  # host data still being written by an offload copy
        plan = self._restore_plan(slots)
        with streams.lane("restore"):
            start = streams.record("restore")
            parts = [_device_parts(pool, dst[lo:hi], streams.pinned) for lo, hi, _ in plan]
            stage = self._in_buffer(min(n, self.in_tokens))
            events = []
            for layer in range(layers):
                for (lo, hi, runs), part in zip(plan, parts, strict=True):
                    for chunk, a, length, off in runs:
                        stage[off - lo : off - lo + length].copy_(chunk[layer, a : a + length], non_blocking=True)
                    _scatter(layer, part, stage[: hi - lo])
                events.append(streams.record("restore"))
        streams.restored(start, events, n * self.shape.bytes_per_token)
        self.slots.free(slots)
        self._last_restore = events[-1]
        self.bytes_to_device += n * self.shape.bytes_per_token
        self.restore_seconds += time.perf_counter() - start_wall
        self.transfer_seconds += time.perf_counter() - start_wall
        return events

    def drop(self, block_id: int) -> int:
        """Forget a block's span (its slots are free again); returns the tokens dropped."""
        span = self._spans.pop(block_id, None)
        if span is None:
            return 0
        self.slots.free(span.slots)
        self.tokens -= span.tokens
        return span.tokens

    def split(self, block_id: int, prefix_id: int, at: int) -> int:
        """A block cut in two (``KVStore.split``): its host tokens below ``at`` become ``prefix_id``'s
        span, the rest stay, renumbered from ``at``; no slot moves. Returns the tokens that moved."""
        span = self._spans.get(block_id)
        if span is None:
            return 0
        if span.heads is not None:
            raise ValueError(f"block {block_id} keeps other tokens in each KV head: its host span cannot be split")
        below = span.idx < at
        n = int(below.sum())
        writes = _pending(span.writes)
        if n:
            self._spans[prefix_id] = HostSpan(span.idx[below], span.slots[below], list(writes))
        if n == span.tokens:
            del self._spans[block_id]
        else:
            self._spans[block_id] = HostSpan(span.idx[~below] - at, span.slots[~below], writes)
        return n

    def forget(self, block_id: int, idx: torch.Tensor) -> int:
        """Forget tokens ``idx`` of a block's span (they were rebuilt on the device); returns how many."""
        span = self._spans.get(block_id)
        if span is None:
            return 0
        gone = torch.isin(span.idx, idx.cpu())
        n = int(gone.sum())
        if n:
            self.slots.free(span.slots[gone])
            if n == span.tokens:
                del self._spans[block_id]
            else:
                heads = None if span.heads is None else span.heads[..., ~gone]
                self._spans[block_id] = HostSpan(span.idx[~gone], span.slots[~gone], span.writes, heads)
        self.tokens -= n
        return n

    # ---- copies ---------------------------------------------------------------------------
    def _copy_out(self, pool: DevicePool, src: torch.Tensor, dst: torch.Tensor) -> Any:
        """Device slots ``src`` (N,) -> host slots ``dst`` (N,), staged ``out_tokens`` at a time."""
        streams = self.streams
        streams.wait("offload", self._last_restore)  # dst may be slots a restore was still reading
        done = DONE
        for lo in range(0, int(src.numel()), self.out_tokens):
            hi = min(lo + self.out_tokens, int(src.numel()))
            k = self._next_out
            self._next_out = 1 - k
            streams.wait("compute", self._out_done[k])  # the buffer's previous copy has left it
            buf = self._out_buffer(k, hi - lo)[:, : hi - lo]
            _gather(pool, src[lo:hi], buf, self.streams.pinned)
            streams.wait("offload", streams.record("compute"))
            with streams.lane("offload"):
                for slot, length, off in ordered_runs(dst[lo:hi], self.slots.bounds):
                    chunk, a = self._locate(slot)
                    for layer in range(self.shape.layers):
                        chunk[layer, a : a + length].copy_(buf[layer, off : off + length], non_blocking=True)
                done = streams.record("offload")
            self._out_done[k] = done
        return done

    def _restore_plan(self, slots: torch.Tensor) -> list[tuple[int, int, list[tuple[torch.Tensor, int, int, int]]]]:
        """Windows ``(lo, hi, runs)`` of at most ``in_tokens`` tokens; a run is ``(chunk, first
        chunk-local slot, length, offset in the batch)`` and never crosses a window."""
        windows = []
        runs = ordered_runs(slots, self.slots.bounds)
        n = int(slots.numel())
        for lo in range(0, n, self.in_tokens):
            hi = min(lo + self.in_tokens, n)
            inside = []
            for slot, length, off in runs:
                a, b = max(off, lo), min(off + length, hi)
                if a < b:
                    chunk, local = self._locate(slot + (a - off))
                    inside.append((chunk, local, b - a, a))
            windows.append((lo, hi, inside))
        return windows

    def _locate(self, slot: int) -> tuple[torch.Tensor, int]:
        i = self.slots.chunk_of(slot)
        return self._chunks[i], slot - self.slots.bounds[i]

    def _grow(self) -> None:
        """Allocate host memory for chunks the slot accounting added."""
        s = self.shape
        while len(self._chunks) < self.slots.chunks:
            i = len(self._chunks)
            size = self.slots.bounds[i + 1] - self.slots.bounds[i]
            self._chunks.append(
                torch.empty(s.layers, size, 2, s.kv_heads, s.head_dim, dtype=s.dtype, pin_memory=self.streams.pinned)
            )

    def _out_buffer(self, k: int, n: int) -> torch.Tensor:
        buf = self._out[k]
        if buf is None or buf.shape[1] < n:
            s = self.shape
            buf = torch.empty(s.layers, n, 2, s.kv_heads, s.head_dim, dtype=s.dtype, device=s.device)
            side = getattr(self.streams, "stream", None)
            if side is not None:  # read by the offload lane: never reused before its copies ran
                buf.record_stream(side("offload"))
            self._out[k] = buf
        return buf

    def _in_buffer(self, n: int) -> torch.Tensor:
        """Allocated (and only ever used) on the restore lane, so reuse is ordered by that lane."""
        if self._in is None or self._in.shape[0] < n:
            s = self.shape
            self._in = torch.empty(n, 2, s.kv_heads, s.head_dim, dtype=s.dtype, device=s.device)
        return self._in


# ---- device side of the copies ------------------------------------------------------------
def _device_parts(
    pool: DevicePool, slots: torch.Tensor, pinned: bool
) -> list[tuple[Any, torch.Tensor | None, torch.Tensor]]:
    """Per arena the slots touch: (arena, positions in ``slots`` or None for all, arena-local slots).

    Index tensors go to the device on the current lane without blocking the host: from pinned
    memory when copies are asynchronous (a copy from pageable memory may wait for the lane).
    """
    device = pool.device

    def upload(t: torch.Tensor) -> torch.Tensor:
        return (t.pin_memory() if pinned else t).to(device, non_blocking=True)

    if len(pool.arenas) == 1:
        arena = pool.arenas[0]
        return [(arena, None, upload(slots - arena.base))]
    parts = []
    for arena in pool.arenas:
        pos = torch.nonzero((slots >= arena.base) & (slots < arena.end)).squeeze(1)
        if pos.numel():
            parts.append((arena, upload(pos), upload(slots[pos] - arena.base)))
    return parts


def _gather(pool: DevicePool, src: torch.Tensor, out: torch.Tensor, pinned: bool) -> None:
    """Pool slots ``src`` (N,) into ``out`` (L, N, 2, H_kv, D) on the current lane."""
    for arena, pos, local in _device_parts(pool, src, pinned):
        k = arena.keys.index_select(2, local).permute(0, 2, 1, 3)  # (L, n, H_kv, D)
        v = arena.values.index_select(2, local).permute(0, 2, 1, 3)
        if pos is None:
            out[:, :, 0].copy_(k)
            out[:, :, 1].copy_(v)
        else:
            out[:, pos, 0] = k
            out[:, pos, 1] = v


def _scatter(layer: int, parts: list, stage: torch.Tensor) -> None:
    """One layer's staged ``stage`` (N, 2, H_kv, D) into its pool slots (``parts`` of those slots)."""
    for arena, pos, local in parts:
        rows = stage if pos is None else stage.index_select(0, pos)
        arena.keys[layer].index_copy_(1, local, rows[:, 0].transpose(0, 1))
        arena.values[layer].index_copy_(1, local, rows[:, 1].transpose(0, 1))


def _extent_slots(extents: list[Extent]) -> torch.Tensor:
    if not extents:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(e.start, e.end) for e in extents])


def _pending(events: list[Any]) -> list[Any]:
    """The events of ``events`` that may still be in flight (a completed one needs no wait)."""
    return [e for e in events if not e.query()]


def _clamp(tokens: int) -> int:
    return max(STAGE_MIN_TOKENS, min(STAGE_MAX_TOKENS, tokens))


__all__ = ["HostFull", "HostSlots", "HostSpan", "HostTier", "Restore", "SyncStreams", "slot_runs"]


def _columns(heads: torch.Tensor | None, idx: torch.Tensor, shape: KVShape) -> torch.Tensor:
    """(L, H_kv, N): a span's per-head tokens, or ``idx`` (N,) in every head for a whole-token one."""
    if heads is not None:
        return heads.cpu()
    return idx.cpu().expand(shape.layers, shape.kv_heads, -1)
