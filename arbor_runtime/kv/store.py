"""Block store: device tier (a slot pool) with token accounting, host tier, and retention plans.

Pure bookkeeping around one :class:`DevicePool`: the store records which pool slots hold which
tokens of each block, counts resident tokens, moves evicted tokens to the host tier (or drops
them) and brings them back. Which tokens stay is decided by a policy; when, and whether there is
room, by the memory manager; the store only carries plans out. Every change is journaled as
(op, block, device delta, host delta) so event logs can be replayed.

Restores are planned here (slots allocated, segments recorded at once) and copied later: they
queue in a :class:`Prefetcher` until :meth:`KVStore.prefetch` issues them on the restore lane,
and the pool (a :class:`FencedPool`) makes every read of those slots wait for its copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from arbor_runtime.kv.block import BlockKV, Segment, layout_changed
from arbor_runtime.kv.host import HostTier
from arbor_runtime.kv.pool import STAGE_TOKENS, Extent
from arbor_runtime.kv.prefetch import FencedPool, Prefetcher
from arbor_runtime.kv.shape import KVShape

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StoreCounters:
    """Movement counters of the store (tokens unless named bytes)."""

    evicted_tokens: int = 0  # moved off the device (to host or dropped)
    dropped_tokens: int = 0  # gone from every tier
    rehydrations: int = 0  # block restores from the host tier
    rehydrated_tokens: int = 0
    recomputed_tokens: int = 0
    host_full_tokens: int = 0  # evicted tokens dropped because the host tier was at its capacity
    peak_host_tokens: int = 0
    peak_host_bytes: int = 0


class KVStore:
    """Block id -> :class:`BlockKV` whose tokens live in a :class:`DevicePool`; a :class:`HostTier`.

    Args:
        shape: the model's KV geometry.
        capacity: device slots; the budget when there is one (the pool never grows), else None.
        host_capacity: host tier slots at most (a policy's ``host_budget_tokens``, or the runtime's
            default :func:`~arbor_runtime.kv.host.default_host_tokens`); None: unbounded.
        streams: the host tier's copy lanes (default: CUDA side streams on CUDA, else synchronous).
    """

    def __init__(
        self, shape: KVShape, capacity: int | None = None, host_capacity: int | None = None, streams=None
    ) -> None:
        self.shape = shape
        self.host = HostTier(shape, capacity=host_capacity, streams=streams)
        self.prefetcher = Prefetcher(self.host)
        # unbounded: arenas on demand
        self.pool = FencedPool(shape, capacity or 0, fixed=capacity is not None, prefetcher=self.prefetcher)
        self.counters = StoreCounters()
        self.journal: list[tuple[str, int, int, int]] = []
        self._blocks: dict[int, BlockKV] = {}
        self._resident_tokens = 0
        #: record attention statistics per layer and KV head too (``BlockKV.head_attention``): set by
        #: the runtime for a per-head policy that ranks by attention (``policy.granularity=head``)
        self.head_stats = False
        #: per-head blocks made whole by restores: put back in token order once their copies are in
        self._to_normalize: set[int] = set()

    # ---- queries -------------------------------------------------------------------------
    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, block_id: int) -> BlockKV:
        try:
            return self._blocks[block_id]
        except KeyError:
            raise KeyError(f"block {block_id} has no KV in the store (released?)") from None

    def block_ids(self) -> list[int]:
        return list(self._blocks)

    @property
    def resident_tokens(self) -> int:
        """Retained tokens over all blocks on the device tier."""
        return self._resident_tokens

    @property
    def resident_bytes(self) -> int:
        return self._resident_tokens * self.shape.bytes_per_token

    @property
    def host_tokens(self) -> int:
        return self.host.tokens

    def dropped(self, block_id: int) -> int:
        """Tokens of a block that are in no tier (only recompute brings them back)."""
        blk = self.get(block_id)
        return blk.length - blk.kept_tokens - self.host_count(block_id)

    def host_count(self, block_id: int) -> int:
        idx = self.host.indices(block_id)
        return 0 if idx is None else int(idx.numel())

    def read(self, block_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of a block's retained K/V in token order: (L, H_kv, T_kept, D) each."""
        blk = self.get(block_id)
        if blk.per_head:
            raise ValueError(f"block {block_id} keeps other tokens in each KV head: read it with read_heads")
        return self.pool.read(blk.slots_of(blk.kept))

    def read_heads(self, block_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A block's device K/V as each layer and KV head holds it, slots in segment order:
        (L, H_kv, T_kept, D) keys and values, and the (L, H_kv, T_kept) block-local token in each
        slot (:meth:`BlockKV.head_tokens`). Whole-token blocks too (every head the same tokens)."""
        blk = self.get(block_id)
        slots = torch.cat([s.slots for s in blk.segments]) if blk.segments else torch.zeros(0, dtype=torch.long)
        keys, values = self.pool.read(slots)
        return keys, values, blk.head_tokens(self.shape.layers, self.shape.kv_heads).clone()

    # ---- updates -------------------------------------------------------------------------
    def put(self, block_id: int, block: BlockKV) -> None:
        """Add a new block whose tokens already sit in its pool segments (its id must be unused)."""
        if block_id in self._blocks:
            raise ValueError(f"block {block_id} is already in the store")
        self._blocks[block_id] = block
        layout_changed()
        self._change("put", block_id, block.kept_tokens, 0)

    def pop(self, block_id: int) -> BlockKV:
        """Remove a block from every tier (its slots go back to the pool) and return its record."""
        block = self._blocks.pop(block_id)
        layout_changed()
        for seg in block.segments:
            self.pool.free(seg.extent)
        host = self.host.drop(block_id)
        self._change("release", block_id, -block.kept_tokens, -host)
        return block

    def split(self, block_id: int, prefix_id: int, at: int) -> None:
        """Cut a block in two: its tokens [0, at) become a new block ``prefix_id``, the rest stay
        ``block_id`` (renumbered from 0, its ``start_pos`` moved by ``at``).

        Bookkeeping only: every token keeps its pool slot (or host slot), so nothing is copied and
        the K/V read back is bit-identical. Everything kept per token is cut too (segments, host
        span, attention mass); both parts keep the block's ``observers``; the prefix has no
        ``next_logits`` (no child samples from it). Journaled as a pair of ``split`` entries
        whose device and host deltas cancel.
        """
        if prefix_id in self._blocks:
            raise ValueError(f"block {prefix_id} is already in the store")
        blk = self.get(block_id)
        if blk.per_head:
            raise ValueError(f"block {block_id} keeps other tokens in each KV head: it cannot be split")
        if not 0 < at < blk.length:
            raise ValueError(f"split of block {block_id} at {at}: must be inside its {blk.length} tokens")
        self.prefetch()  # queued restores of this block are issued under its old numbering
        low, high = _split_segments(blk.segments, at)
        head = BlockKV(low, blk.start_pos, at, None, blk.attention[:at].clone(), blk.observers)
        blk.set_segments(high)
        blk.start_pos, blk.length = blk.start_pos + at, blk.length - at
        blk.attention = blk.attention[at:].clone()
        if blk.head_attention is not None:
            head.head_attention = blk.head_attention[..., :at].clone()
            blk.head_attention = blk.head_attention[..., at:].clone()
        hosted = self.host.split(block_id, prefix_id, at)
        self._blocks[prefix_id] = head
        layout_changed()
        self._change("split", block_id, -head.kept_tokens, -hosted)
        self._change("split", prefix_id, head.kept_tokens, hosted)

    def add_tokens(self, block_id: int, extents: list[Extent], idx: torch.Tensor, op: str = "recompute") -> None:
        """Record that tokens ``idx`` (N,) of a block now fill ``extents`` (in order).

        Used for recomputed tokens (which replace whatever the host held for them) and for the
        next chunk of a block prefilled in chunks (``op="extend"``; the block's length grows).
        """
        blk = self.get(block_id)
        segments, offset = list(blk.segments), 0
        for ext in extents:
            segments.append(Segment(ext.start, idx[offset : offset + ext.length].clone()))
            offset += ext.length
        blk.set_segments(segments)
        if blk.per_head:  # the new slots hold the same tokens in every head
            new = idx[:offset].expand(self.shape.layers, self.shape.kv_heads, -1)
            blk.heads = torch.cat([blk.heads, new], dim=-1)
        if op == "extend":
            grown = int(idx.max()) + 1 - blk.length
            if grown > 0:
                blk.length += grown
                blk.attention = torch.cat([blk.attention, torch.zeros(grown)])
            self._change("extend", block_id, int(idx.numel()), 0)
            return
        host = self.host.forget(block_id, idx)
        self.counters.recomputed_tokens += int(idx.numel()) - host
        self._change("recompute", block_id, int(idx.numel()), -host)

    def apply(self, block_id: int, keep: torch.Tensor, offload: bool) -> None:
        """Carry out one block's retention plan: exactly ``keep`` (block-local indices) on device.

        Tokens leaving the device go to the host tier when ``offload``, else are dropped. Tokens in
        ``keep`` that are on the host come back (bit-identical) into free pool slots (the caller
        made sure there are enough); tokens in ``keep`` that were dropped cannot come back here
        (see :meth:`add_tokens`) and are ignored.
        """
        blk = self.get(block_id)
        keep = keep.cpu()
        self._evict(block_id, blk, keep, offload)
        host_idx = self.host.indices(block_id)
        if host_idx is not None:
            wanted = host_idx[torch.isin(host_idx, keep)]
            if wanted.numel():
                self._restore(block_id, wanted)

    def apply_heads(self, block_id: int, keep: torch.Tensor, heads: torch.Tensor, offload: bool = False) -> None:
        """Carry out a per-(layer, KV head) retention plan: each layer and KV head keeps its own
        ``k`` tokens, the same count everywhere, so the block stays rectangular and the budget in
        token slots is unchanged (as kvpress's presses gather per head).

        Args:
            keep: (k,) the nominal tokens (a subset of ``kept``: what a whole-token plan chose; the
                planner counts them, ``kept`` reports them after).
            heads: (L, H_kv, k) block-local tokens each layer and KV head keeps, each row a subset of
                what that head holds now (:meth:`BlockKV.head_tokens`).
            offload: the evicted K/V go to the host tier (else they are dropped).

        Each head's kept K/V move, in slot order, to the block's first ``k`` slots; the slots after
        them are labelled with the nominal tokens that leave (and, when offloaded, hold each head's
        evicted K/V), and leave as any evicted tokens do (:meth:`apply`): a host span of a per-head
        block records what each head holds in each of its slots, and comes back the same way.
        Dropping moves the kept K/V only, in place, ``STAGE_TOKENS`` slots at a time (a head's j-th
        kept slot is never before its j-th slot); offloading permutes each layer's slots of the block
        through one (H_kv, T_kept, D) copy.
        """
        self.prefetch()  # queued restores land (and a block they made whole is in token order) before heads are read
        blk = self.get(block_id)
        layers, kv_heads = self.shape.layers, self.shape.kv_heads
        keep, heads = torch.sort(keep.cpu()).values, heads.cpu().long()
        k = int(keep.numel())
        if tuple(heads.shape) != (layers, kv_heads, k):
            raise ValueError(f"heads {tuple(heads.shape)} must be (L, H_kv, k) = ({layers}, {kv_heads}, {k})")
        if not bool(torch.isin(keep, blk.kept).all()):
            raise ValueError(f"keep names tokens of block {block_id} that are not on the device")
        held = blk.head_tokens(layers, kv_heads)
        pos = _slot_positions(held, heads, blk.length)
        if pos is None:
            raise ValueError(f"heads name tokens of block {block_id} that a layer's KV head does not hold (or twice)")
        leaving = torch.ones(held.shape, dtype=torch.int8).scatter_(2, pos, 0)
        order = torch.sort(leaving, dim=-1, stable=True).indices  # per head: kept slots, then the others
        slots = torch.cat([s.slots for s in blk.segments]) if blk.segments else torch.zeros(0, dtype=torch.long)
        self.pool.settle(slots)
        if offload:
            self._permute_heads(slots, order)
        else:
            self._gather_heads_front(slots, order[..., :k])
        nominal = torch.cat([keep, blk.kept[~torch.isin(blk.kept, keep)]])  # slot order: kept, then leaving
        blk.set_segments(_relabel(blk.segments, nominal))
        blk.heads = held.gather(2, order)
        self._evict(block_id, blk, keep, offload)

    def _permute_heads(self, slots: torch.Tensor, order: torch.Tensor) -> None:
        """Each layer's KV head h of the block in ``slots`` (K,) reordered: slot j gets what slot
        ``order[l, h, j]`` held (``order``: (L, H_kv, K))."""
        for layer in range(order.shape[0]):
            k, v = self.pool.gather_heads(layer, slots[order[layer]])
            self.pool.write_heads(layer, slots.expand(order.shape[1], -1), k, v)

    def _gather_heads_front(self, slots: torch.Tensor, front: torch.Tensor) -> None:
        """Each layer's KV head h: slot j (< k) gets what slot ``front[l, h, j]`` held (``front``
        (L, H_kv, k) increasing per head, so ``front[j] >= j``: copied in place, chunk by chunk)."""
        k = front.shape[-1]
        for layer in range(front.shape[0]):
            for j in range(0, k, STAGE_TOKENS):
                end = min(j + STAGE_TOKENS, k)
                src = slots[front[layer, :, j:end]]  # (H_kv, c)
                dst = slots[j:end].expand_as(src)
                if bool((src != dst).any()):
                    self.pool.write_heads(layer, dst, *self.pool.gather_heads(layer, src))

    def clear_device(self, block_id: int) -> int:
        """Free every device slot of a block (before it is rebuilt whole by a recompute); returns how many."""
        blk = self.get(block_id)
        n = blk.kept_tokens
        self.prefetch()
        slots = torch.cat([s.slots for s in blk.segments]) if blk.segments else torch.zeros(0, dtype=torch.long)
        self.pool.settle(slots)
        for seg in blk.segments:
            self.pool.free(seg.extent)
        blk.set_segments([])
        blk.heads = None
        if n:
            self._change("recompute", block_id, -n, 0)
        return n

    def prefetch(self) -> None:
        """Start the planned restores on the restore lane (the step's forward waits per block and layer);
        a per-head block they made whole is put back in token order (:meth:`_normalize`)."""
        self.prefetcher.issue()
        while self._to_normalize:
            self._normalize(self._to_normalize.pop())

    def _normalize(self, block_id: int) -> None:
        """A per-head block holding all its tokens in every head again: each head's slots permuted so
        slot j holds its nominal token in every layer and head, as before the per-head eviction (the
        rehydrated layout is bit-identical to the original's), and ``heads`` dropped."""
        blk = self._blocks.get(block_id)
        if blk is None or blk.heads is None or blk.kept_tokens != blk.length:
            return
        order = torch.cat([seg.idx for seg in blk.segments])
        lookup = torch.full((*blk.heads.shape[:2], blk.length), -1, dtype=torch.long)
        lookup.scatter_(2, blk.heads, torch.arange(blk.length).expand_as(blk.heads).contiguous())
        src = lookup[..., order]  # (L, H_kv, K): where each head holds the token slot j should hold
        if bool((src < 0).any()):
            return  # some head lacks a token (never after a restore of everything it evicted)
        slots = torch.cat([seg.slots for seg in blk.segments])
        self.pool.settle(slots)
        self._permute_heads(slots, src)
        blk.heads = None

    def drop_host(self, block_id: int) -> int:
        """Drop a block's host span (host cap); returns tokens dropped."""
        n = self.host.drop(block_id)
        if n:
            self.counters.dropped_tokens += n
            self._change("drop_host", block_id, 0, -n)
        return n

    def consolidate(self, block_id: int) -> bool:
        """Move a block split over several segments into one free range, if one fits; True if moved."""
        blk = self.get(block_id)
        n = blk.kept_tokens
        if len(blk.segments) <= 1 or self.pool.largest_free() < n:
            return False
        (ext,) = self.pool.alloc(n, contiguous=True)
        src = torch.cat([s.slots for s in blk.segments])
        self.pool.move(src, torch.arange(ext.start, ext.end))
        idx = torch.cat([s.idx for s in blk.segments])
        for seg in blk.segments:
            self.pool.free(seg.extent)
        blk.set_segments([Segment(ext.start, idx)])
        return True

    def add_head_attention(
        self, block_id: int, tokens: torch.Tensor, mass: torch.Tensor, replace: bool = False
    ) -> None:
        """Add per-(layer, KV head) attention ``mass`` (L, H_kv, N) to a block's tokens: ``tokens`` (N,)
        the same in every head, or (L, H_kv, N) each head's own. ``replace``: the new record replaces
        the old one of those tokens (an observation window). Released blocks are skipped."""
        blk = self._blocks.get(block_id)
        if blk is None:
            return
        layers, kv_heads = self.shape.layers, self.shape.kv_heads
        if blk.head_attention is None or blk.head_attention.shape[-1] < blk.length:
            grown = torch.zeros(layers, kv_heads, blk.length)
            if blk.head_attention is not None:
                grown[..., : blk.head_attention.shape[-1]] = blk.head_attention
            blk.head_attention = grown
        tokens = tokens.cpu().long()
        if tokens.dim() == 1:
            tokens = tokens.expand(layers, kv_heads, -1)
        if replace:
            blk.head_attention.scatter_(2, tokens, 0.0)
        blk.head_attention.scatter_add_(2, tokens, mass.float().cpu())

    def add_head_attention_at(self, block_id: int, start: int, mass: torch.Tensor, replace: bool = False) -> None:
        """:meth:`add_head_attention` for the consecutive slots from pool slot ``start`` (a read's piece):
        ``mass`` (L, H_kv, N) goes to the tokens each head holds in those slots."""
        blk = self._blocks.get(block_id)
        if blk is None:
            return
        offset, n = 0, int(mass.shape[-1])
        for seg in blk.segments:
            if seg.start <= start < seg.start + seg.length:
                at = offset + start - seg.start
                held = blk.head_tokens(self.shape.layers, self.shape.kv_heads)[..., at : at + n]
                self.add_head_attention(block_id, held, mass, replace)
                return
            offset += seg.length
        raise KeyError(f"slot {start} holds no token of block {block_id}")

    def add_attention(self, block_id: int, tokens: torch.Tensor, mass: torch.Tensor, queries: float) -> None:
        """Add attention ``mass`` (N,) received by block-local ``tokens`` (N,) from ``queries`` queries.

        Released blocks are skipped (a plan may release a block while its mass is in flight).
        """
        blk = self._blocks.get(block_id)
        if blk is None:
            return
        blk.attention.index_add_(0, tokens.cpu(), mass.float().cpu())
        blk.observers += queries

    # ---- internals -----------------------------------------------------------------------
    def _evict(self, block_id: int, blk: BlockKV, keep: torch.Tensor, offload: bool) -> None:
        leaving = blk.kept[~torch.isin(blk.kept, keep)]
        n = int(leaving.numel())
        if n == 0:
            return
        hosted = self._offload(block_id, leaving) if offload else 0
        before = torch.cat([seg.idx for seg in blk.segments])
        blk.set_segments([self._compact(seg, keep) for seg in blk.segments])
        if blk.heads is not None:  # each slot's per-head tokens move with the slot
            after = torch.cat([seg.idx for seg in blk.segments]) if blk.segments else before[:0]
            blk.heads = blk.heads[..., _positions_of(before, after, blk.length)]
        self.counters.evicted_tokens += n
        self.counters.dropped_tokens += n - hosted
        if hosted:
            self._change("evict", block_id, -hosted, hosted)
        if hosted < n:
            self._change("drop", block_id, -(n - hosted), 0)

    def _offload(self, block_id: int, leaving: torch.Tensor) -> int:
        """Copy ``leaving`` (N,) block-local tokens to the host tier, as many as it has room for
        (the rest are dropped: recompute brings them back); returns how many went."""
        self.prefetch()  # queued restores first: they free host slots and may be reading these ones
        fit = min(int(leaving.numel()), self.host.room())
        if fit < leaving.numel():
            self.counters.host_full_tokens += int(leaving.numel()) - fit
            log.warning("host tier full: %d evicted tokens of block %d dropped", leaving.numel() - fit, block_id)
        if fit:
            blk = self.get(block_id)
            src = blk.slots_of(leaving[:fit])
            self.pool.settle(src)
            heads = None
            if blk.heads is not None:  # what each head holds in those slots goes with them
                order = torch.cat([seg.idx for seg in blk.segments])
                heads = blk.heads[..., _positions_of(order, leaving[:fit], blk.length)]
            self.host.put(block_id, leaving[:fit], self.pool, src, heads)
        return fit

    def _compact(self, seg: Segment, keep: torch.Tensor) -> Segment:
        """Move a segment's kept tokens to its front and free the rest of its slots."""
        stay = torch.isin(seg.idx, keep)
        k = int(stay.sum())
        if k < seg.length:
            src = seg.start + torch.nonzero(stay).squeeze(1)
            dst = torch.arange(seg.start, seg.start + k)
            moved = src != dst
            if bool(moved.any()):
                self.pool.move(src[moved], dst[moved])
            self.pool.free(Extent(seg.start + k, seg.length - k))
        return Segment(seg.start, seg.idx[stay])

    def _restore(self, block_id: int, idx: torch.Tensor) -> None:
        """Plan tokens ``idx`` (N,) back from the host: slots and segments now, the copy at :meth:`prefetch`."""
        blk = self.get(block_id)
        restore = self.host.take(block_id, idx)
        idx = restore.idx
        layers, kv_heads = self.shape.layers, self.shape.kv_heads
        per_head = blk.per_head or restore.heads is not None
        columns = blk.head_tokens(layers, kv_heads).clone() if per_head else None
        extents = self.pool.alloc(int(idx.numel()))
        restore.device_slots = torch.cat([torch.arange(e.start, e.end) for e in extents])
        self.prefetcher.add(restore)
        segments, offset = list(blk.segments), 0
        for ext in extents:
            segments.append(Segment(ext.start, idx[offset : offset + ext.length].clone()))
            offset += ext.length
        blk.set_segments(segments)
        if columns is not None:  # the restored slots hold what each head held when they left
            back = restore.heads if restore.heads is not None else idx.expand(layers, kv_heads, -1)
            blk.heads = torch.cat([columns, back], dim=-1)
            if blk.kept_tokens == blk.length:
                self._to_normalize.add(block_id)
        self.counters.rehydrations += 1
        self.counters.rehydrated_tokens += int(idx.numel())
        self._change("rehydrate", block_id, int(idx.numel()), -int(idx.numel()))

    def _change(self, op: str, block_id: int, device_delta: int, host_delta: int) -> None:
        self._resident_tokens += device_delta
        self.journal.append((op, block_id, device_delta, host_delta))
        if self.host.tokens > self.counters.peak_host_tokens:
            self.counters.peak_host_tokens = self.host.tokens
            self.counters.peak_host_bytes = self.host.tokens * self.shape.bytes_per_token


def _split_segments(segments: list[Segment], at: int) -> tuple[list[Segment], list[Segment]]:
    """Segments of tokens below ``at`` and, renumbered from ``at``, of the rest: a segment holding
    both is cut into runs of consecutive slots (its slots stay where they are)."""
    low, high = [], []
    for seg in segments:
        below = seg.idx < at
        cuts = [0, *(torch.nonzero(below[1:] != below[:-1]).squeeze(1) + 1).tolist(), seg.length]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            if bool(below[a]):
                low.append(Segment(seg.start + a, seg.idx[a:b].clone()))
            else:
                high.append(Segment(seg.start + a, seg.idx[a:b] - at))
    return low, high


def _slot_positions(held: torch.Tensor, want: torch.Tensor, length: int) -> torch.Tensor | None:
    """Where each head holds the tokens it should keep: ``held`` (L, H_kv, K) tokens per slot,
    ``want`` (L, H_kv, k) -> (L, H_kv, k) slot positions; None if some wanted token is not held by
    its head or is wanted twice."""
    if want.numel() and (int(want.min()) < 0 or int(want.max()) >= length):
        return None
    lookup = torch.full((*held.shape[:2], length), -1, dtype=torch.long)
    lookup.scatter_(2, held, torch.arange(held.shape[-1]).expand_as(held).contiguous())
    pos = lookup.gather(2, want)
    if bool((pos < 0).any()):
        return None
    if want.shape[-1] > 1 and bool((torch.sort(pos, dim=-1).values.diff(dim=-1) == 0).any()):
        return None
    return pos


def _relabel(segments: list[Segment], nominal: torch.Tensor) -> list[Segment]:
    """The same slots, their nominal tokens now ``nominal`` (K,) in segment order."""
    out, used = [], 0
    for seg in segments:
        out.append(Segment(seg.start, nominal[used : used + seg.length].clone()))
        used += seg.length
    return out


def _positions_of(order: torch.Tensor, tokens: torch.Tensor, length: int) -> torch.Tensor:
    """Where each of ``tokens`` (N,) is in ``order`` (K,) (a block's nominal tokens in slot order)."""
    lookup = torch.full((length,), -1, dtype=torch.long)
    lookup[order] = torch.arange(order.numel())
    return lookup[tokens.cpu()]
