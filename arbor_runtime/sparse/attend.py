"""Sparse decode attention: each decode query reads the sinks, the recent window and the chunks
its block indexes rank highest, and nothing else of the context.

One :class:`SparseAttention` per runtime holds an index per block (built the first time a decode
step reads the block, updated lazily when the block gains tokens, dropped with the block). For a
decode batch, :meth:`SparseAttention.prepare` lays out the step once (every context block's
chunks and the pool slots of their resident tokens, which chunks each row must read); then at
every layer :meth:`SparseStep.attend`:

1. retrieval: each indexed block ranks its chunks for the rows that hold it, per KV head
   (batched over rows and heads); with the forced chunks (sinks, window, blocks read whole)
   they are sorted and taken until ``token_budget`` resident tokens per row and head;
2. attention: the chosen chunks' K/V are gathered from the pool (rows x heads x budget: bounded
   scratch, never rows x context), attended with the row's own tokens, and merged by
   log-sum-exp exactly as the dense path merges its pieces.

Retrieval is over what is resident: chunks whose tokens a memory policy evicted are skipped, a
partly evicted chunk is read for the tokens it still has (its bound still holds for them).
Blocks shorter than ``min_block_tokens`` are read whole (not indexed). Index memory counts in
the budget: with a budget the index may hold at most ``reserve_bytes`` (the pool is smaller by
as many token slots); a block whose index would not fit is read whole.

Times are recorded apart: index (retrieval and selection), attention (gather, attention,
merge), build (index construction and updates).

On demand (``on_demand``, a sparse policy's ``rehydrate=ranked``), the index also decides which
evicted spans come back first: indexes then cover the host-tier tokens of a block too (their keys
are read from the host), every decode step counts, per chunk on the host, the (layer, row, KV
head) selections it would have entered had it been resident, and :meth:`SparseAttention.wanted`
lists those chunks' host tokens most wanted first (blocks read whole before any, their tokens by
accumulated attention, in pieces of a chunk's width), for the memory manager to restore before
the next step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from arbor_runtime.attention.merge import merge_partials
from arbor_runtime.batch import BatchView, Group
from arbor_runtime.sparse.chunking import BoundaryTable

if TYPE_CHECKING:
    from arbor_runtime.kv.store import KVStore


class BlockIndex(Protocol):
    """What an index over one block offers (:class:`~arbor_runtime.sparse.tree.ChunkTree`,
    :class:`~arbor_runtime.sparse.pages.PageIndex`)."""

    starts: torch.Tensor  # (C + 1,) chunk boundaries, block-local
    covered: torch.Tensor  # (T,) bool

    @property
    def n_chunks(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def update(self, keys, layers: int, resident: torch.Tensor, ends: torch.Tensor) -> bool: ...

    def retrieve(self, layer: int, q: torch.Tensor, n: int, exact: bool = False): ...


#: build(keys, layers, resident (T_res,), ends (T,)) -> a block's index
IndexBuilder = Callable[..., BlockIndex]


@dataclass(frozen=True, slots=True)
class SelectConfig:
    """What a decode query reads.

    Attributes:
        token_budget: resident context tokens read per row and KV head (sinks and window included).
        sink_tokens: the first positions of the path, always read.
        window_tokens: the last positions of the context, always read (the row's own tokens are too).
        min_block_tokens: blocks shorter than this are read whole, not indexed.
        exact: exact top-k retrieval by bound (lychee's second pass) instead of the beam descent.
        width: most tokens in one chunk (the gather width).
    """

    token_budget: int = 1024
    sink_tokens: int = 16
    window_tokens: int = 64
    min_block_tokens: int = 64
    exact: bool = False
    width: int = 16


@dataclass(slots=True)
class SparseStats:
    """Running totals of a runtime's sparse decode steps (seconds are summed over layers)."""

    steps: int = 0
    index_seconds: float = 0.0  # layout (per step) + retrieval and selection (per layer)
    layout_seconds: float = 0.0  # the per-step layout alone (outside the attention layers)
    attention_seconds: float = 0.0
    build_seconds: float = 0.0
    read_tokens: int = 0  # context tokens attended, summed over rows, KV heads and layers
    context_tokens: int = 0  # resident context tokens a dense step would attend, same sums
    index_bytes: int = 0
    peak_index_bytes: int = 0
    indexed_tokens: int = 0  # tokens of the blocks the indexes cover now
    indexed_kv_bytes: int = 0
    builds: int = 0
    updates: int = 0
    unindexed_blocks: int = 0  # blocks read whole because their index would not fit the reserve

    @property
    def read_fraction(self) -> float:
        return self.read_tokens / self.context_tokens if self.context_tokens else 1.0

    @property
    def index_ratio(self) -> float:
        """Index bytes over the bytes of the KV they index."""
        return self.index_bytes / self.indexed_kv_bytes if self.indexed_kv_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        return out | {"read_fraction": self.read_fraction, "index_ratio": self.index_ratio}


@dataclass(slots=True)
class _Entry:
    """A block as the sparse layer knows it: its index (None = read whole) and its cached layout."""

    index: BlockIndex | None
    length: int
    layout_key: tuple = ()
    layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class SparseAttention:
    """The per-runtime sparse decode attention (see module docstring).

    Args:
        builder: builds one block's index.
        select: what a query reads.
        store: the block store (its pool holds every K/V read here).
        token_ids: block id -> its token ids (sentence ends come from their text).
        decode: token ids -> text (a tokenizer's ``decode``), None when there is no text.
        reserve_bytes: most bytes the indexes may hold (None: no cap).
        on_demand: rank the active path's evicted chunks for rehydration (module docstring).
    """

    def __init__(
        self,
        builder: IndexBuilder,
        select: SelectConfig,
        store: KVStore,
        token_ids: Callable[[int], Sequence[int]],
        decode: Callable[[list[int]], str] | None = None,
        reserve_bytes: int | None = None,
        on_demand: bool = False,
    ) -> None:
        self.builder, self.select, self.store = builder, select, store
        self.token_ids, self.reserve_bytes, self.on_demand = token_ids, reserve_bytes, on_demand
        self.last_step: SparseStep | None = None
        self.boundaries = BoundaryTable(decode)
        self.entries: dict[int, _Entry] = {}
        self.stats = SparseStats()
        #: the clock of the stats' seconds (benchmarks on a shared CPU use ``time.thread_time``)
        self.clock: Callable[[], float] = time.perf_counter

    # ---- per step ------------------------------------------------------------------------------
    def prepare(self, batch: BatchView, positions: torch.Tensor) -> SparseStep:
        """Lay out one decode step: positions (R,) are the rows' current token positions."""
        start, built = self.clock(), self.stats.build_seconds
        self._forget_released()
        step = SparseStep(self, batch)
        for grp in batch.groups:
            entry = self._entry(grp.block_id)
            step.add_group(grp, entry, self.store.get(grp.block_id).start_pos)
        for block_id, rows in self._away(batch):
            step.add_away(block_id, rows, self._entry(block_id))
        step.finish(positions)
        self.last_step = step if self.on_demand else None
        self.stats.steps += 1
        layout = self.clock() - start - (self.stats.build_seconds - built)  # builds are timed apart
        self.stats.layout_seconds += layout
        self.stats.index_seconds += layout
        return step

    def _away(self, batch: BatchView) -> list[tuple[int, torch.Tensor | None]]:
        """On demand: context blocks with every token on the host (no group in the batch), with the
        rows holding them (None = every row); their chunks are ranked for rehydration, not read."""
        if not self.on_demand or batch.context_ids is None:
            return []
        present = {g.block_id for g in batch.groups}
        holders: dict[int, list[int]] = {}
        for row, ids in enumerate(batch.context_ids):
            for block_id in ids:
                if block_id not in present and block_id in self.store.host:
                    holders.setdefault(block_id, []).append(row)
        every = len(batch.context_ids)
        return [(b, None if len(r) == every else torch.tensor(r)) for b, r in sorted(holders.items())]

    # ---- indexes -------------------------------------------------------------------------------
    def _entry(self, block_id: int) -> _Entry:
        """The block's entry, its index built or lazily updated to what is resident now."""
        blk = self.store.get(block_id)
        entry = self.entries.get(block_id)
        if entry is not None and entry.index is None and entry.length == blk.length:
            return entry  # read whole
        if entry is None and blk.length < self.select.min_block_tokens:
            entry = self.entries[block_id] = _Entry(None, blk.length)
            return entry
        start = self.clock()
        resident = self._known(block_id)
        if entry is None or entry.index is None:
            index = self._build(block_id, resident, blk.length)
            entry = self.entries[block_id] = _Entry(index, blk.length)
        elif blk.length != entry.length or not bool(entry.index.covered[resident].all()):
            before = entry.index.nbytes
            entry.index.update(self._keys(block_id), self.store.shape.layers, resident, self._ends(block_id))
            entry.length = blk.length
            self.stats.updates += 1
            self._account(entry.index.nbytes - before, 0)
        self.stats.build_seconds += self.clock() - start
        return entry

    def _known(self, block_id: int) -> torch.Tensor:
        """(T_known,) sorted block-local tokens an index covers: the resident ones, and on demand
        also those on the host tier (their keys are read from there)."""
        kept = self.store.get(block_id).kept
        host = self.store.host.indices(block_id) if self.on_demand else None
        return kept if host is None else torch.sort(torch.cat([kept.cpu(), host])).values

    def _build(self, block_id: int, resident: torch.Tensor, length: int) -> BlockIndex | None:
        settle = getattr(self.store.pool, "settle", None)
        if settle is not None:  # restores into these slots finish before the keys are read
            settle(self.store.get(block_id).slots_of(self.store.get(block_id).kept))
        index = self.builder(self._keys(block_id), self.store.shape.layers, resident, self._ends(block_id))
        size = index.nbytes
        if self.reserve_bytes is not None and self.stats.index_bytes + size > self.reserve_bytes:
            self.stats.unindexed_blocks += 1
            return None
        self.stats.builds += 1
        self._account(size, length)
        return index

    def _account(self, nbytes: int, tokens: int) -> None:
        s = self.stats
        s.index_bytes += nbytes
        s.indexed_tokens += tokens
        s.indexed_kv_bytes += tokens * self.store.shape.bytes_per_token
        s.peak_index_bytes = max(s.peak_index_bytes, s.index_bytes)

    def _forget_released(self) -> None:
        for block_id in [b for b in self.entries if b not in self.store]:
            entry = self.entries.pop(block_id)
            if entry.index is not None:
                self._account(-entry.index.nbytes, -entry.length)

    def _keys(self, block_id: int):
        """A key reader over the block's device tokens, and on demand its host-tier tokens too."""
        blk, pool = self.store.get(block_id), self.store.pool

        def read(layer: int, tokens: torch.Tensor) -> torch.Tensor:
            return pool.gather_layer(layer, blk.slots_of(tokens))[0]  # (H, n, D)

        if not self.on_demand or block_id not in self.store.host:
            return read
        host_idx, host_keys, _ = self.store.host.read(block_id)  # (E,), (L, H, E, D)

        def read_both(layer: int, tokens: torch.Tensor) -> torch.Tensor:
            away = torch.isin(tokens, host_idx)
            out = torch.empty(host_keys.shape[1], int(tokens.numel()), host_keys.shape[-1], dtype=host_keys.dtype)
            if bool((~away).any()):
                out[:, ~away] = read(layer, tokens[~away]).to(out.dtype)
            out[:, away] = host_keys[layer][:, torch.searchsorted(host_idx, tokens[away])]
            return out

        return read_both

    def wanted(self) -> list[tuple[int, torch.Tensor]]:
        """The last step's demand for evicted spans, most wanted first: (block id, its block-local
        tokens on the host). Blocks read whole come first (all their tokens are read; the most
        attended first, in pieces of a chunk's width), then the chunks by how many (layer, row, KV
        head) selections they would have entered (ties: block order, then position). Empty unless
        on demand; each step's demand is handed out once."""
        step, self.last_step = self.last_step, None
        if step is None:
            return []
        out: list[tuple[float, int, int, int, torch.Tensor]] = []
        width = self.select.width
        for order, block_id in enumerate(step.whole_blocks):
            idx = self.store.host.indices(block_id) if block_id in self.store else None
            if idx is not None:  # no index to rank them: the most attended tokens first, in pieces
                idx = idx[torch.argsort(self.store.get(block_id).attention[idx], descending=True, stable=True)]
                for i in range(0, int(idx.numel()), width):
                    out.append((float("inf"), order, i, block_id, idx[i : i + width].sort().values))
        demand = step.demand.cpu() if step.demand is not None else None
        for order, plan in enumerate(step.plans):
            idx = self.store.host.indices(plan.block_id) if plan.block_id in self.store else None
            if idx is None or demand is None:
                continue
            mine = demand[plan.offset : plan.offset + plan.index.n_chunks]
            chunk = torch.searchsorted(plan.index.starts, idx, right=True) - 1
            for c in torch.nonzero(mine > 0).squeeze(1).tolist():
                out.append((float(mine[c]), len(step.whole_blocks) + order, c, plan.block_id, idx[chunk == c]))
        out.sort(key=lambda w: (-w[0], w[1], w[2]))
        return [(block_id, idx) for _, _, _, block_id, idx in out if idx.numel()]

    def _ends(self, block_id: int) -> torch.Tensor:
        return self.boundaries.ends(self.token_ids(block_id))

    @property
    def nbytes(self) -> int:
        """Bytes the indexes hold now."""
        return self.stats.index_bytes


@dataclass(slots=True)
class _GroupPlan:
    """An indexed context block of a step: its index, rows (None = all), first chunk id, chunks asked."""

    index: BlockIndex
    rows: torch.Tensor | None
    offset: int
    n: int
    block_id: int = -1


@dataclass(slots=True)
class SparseStep:
    """One decode step's layout (:meth:`SparseAttention.prepare`) and its per-layer attention.

    Chunks of every context block get step-wide ids. Tables: ``slots`` (C, W) pool slots of each
    chunk's resident tokens (-1 padded), ``length`` (C,) resident tokens, ``target`` (C, W) the
    token's place in the concatenation of every group's pieces (for attention statistics),
    ``forced`` (R, C) bool chunks a row always reads, ``visible`` (R, C) bool.
    """

    owner: SparseAttention
    batch: BatchView
    plans: list[_GroupPlan] = field(default_factory=list)
    parts: list[tuple] = field(default_factory=list)
    n_chunks: int = 0
    n_tokens: int = 0
    piece_offsets: list[list[int]] = field(default_factory=list)
    slots: torch.Tensor | None = None
    length: torch.Tensor | None = None
    target: torch.Tensor | None = None
    forced: torch.Tensor | None = None
    forced_ids: torch.Tensor | None = None
    context: torch.Tensor | None = None
    hosted_ids: list[torch.Tensor] = field(default_factory=list)
    hosted: torch.Tensor | None = None  # (C,) bool: chunk has host-tier tokens its index covers (on demand)
    demand: torch.Tensor | None = None  # (C,) float: selections each hosted chunk would have entered
    whole_blocks: list[int] = field(default_factory=list)  # context blocks read whole (not indexed)

    def add_group(self, grp: Group, entry: _Entry, start_pos: int) -> None:
        """Lay out one context block's chunks (cached per block while its segments stay)."""
        width = self.owner.select.width
        key = tuple((p.start, p.length) for p in grp.pieces) + (entry.length, id(entry.index))
        if entry.layout_key != key or entry.layout is None:
            entry.layout = _layout(grp, entry.index, width)
            entry.layout_key = key
        slots, target, lo, hi = entry.layout
        offsets, off = [], self.n_tokens
        for p in grp.pieces:
            offsets.append(off)
            off += p.length
        self.piece_offsets.append(offsets)
        whole = entry.index is None
        if whole:
            self.whole_blocks.append(grp.block_id)
        elif self.owner.on_demand:
            self._note_hosted(grp.block_id, entry.index)
        self.parts.append((grp.rows, slots, target + self.n_tokens, lo + start_pos, hi + start_pos, whole))
        if not whole:
            sel = self.owner.select
            mean = max(entry.length / max(entry.index.n_chunks, 1), 1.0)
            n = min(entry.index.n_chunks, math.ceil(sel.token_budget / mean) + 1)
            self.plans.append(_GroupPlan(entry.index, grp.rows, self.n_chunks, n, grp.block_id))
        self.n_chunks += int(slots.shape[0])
        self.n_tokens = off

    def add_away(self, block_id: int, rows: torch.Tensor | None, entry: _Entry) -> None:
        """A context block with no token on the device: its chunks join the step unread (length 0),
        so retrieval ranks them for rehydration; a block too short to index is wanted whole."""
        if entry.index is None:
            self.whole_blocks.append(block_id)
            return
        self._note_hosted(block_id, entry.index)
        c, w = entry.index.n_chunks, self.owner.select.width
        empty = torch.full((c, w), -1, dtype=torch.long)
        lo, hi = torch.full((c,), 1 << 40), torch.full((c,), -(1 << 40))  # never a sink nor in the window
        self.parts.append((rows, empty, empty, lo, hi, False))
        mean = max(entry.length / max(c, 1), 1.0)
        n = min(c, math.ceil(self.owner.select.token_budget / mean) + 1)
        self.plans.append(_GroupPlan(entry.index, rows, self.n_chunks, n, block_id))
        self.n_chunks += c

    def _note_hosted(self, block_id: int, index: BlockIndex) -> None:
        """Step chunk ids of the block's chunks that have host-tier tokens the index covers."""
        idx = self.owner.store.host.indices(block_id)
        if idx is None:
            return
        idx = idx[index.covered[idx]] if int(index.covered.numel()) else idx[:0]
        chunk = torch.searchsorted(index.starts, idx, right=True) - 1
        self.hosted_ids.append(torch.unique(chunk) + self.n_chunks)

    def finish(self, positions: torch.Tensor) -> None:
        """Step-wide tables and, per row, the chunks it must read (sinks, window, blocks read whole)."""
        sel, r = self.owner.select, self.batch.rows
        empty = torch.zeros(0, sel.width, dtype=torch.long)
        self.slots = torch.cat([p[1] for p in self.parts]) if self.parts else empty
        self.target = torch.cat([p[2] for p in self.parts]) if self.parts else empty
        self.length = (self.slots >= 0).sum(-1)
        visible = torch.zeros(r, self.n_chunks, dtype=torch.bool)
        forced = torch.zeros(r, self.n_chunks, dtype=torch.bool)
        pos = positions.view(-1, 1).cpu()
        c = 0
        for rows, slots, _, lo, hi, whole in self.parts:
            n = int(slots.shape[0])
            seen = torch.ones(r, dtype=torch.bool)
            if rows is not None:
                seen = torch.zeros(r, dtype=torch.bool).index_fill_(0, rows.cpu(), True)
            visible[:, c : c + n] = seen.view(-1, 1)
            must = (lo < sel.sink_tokens).view(1, -1) | (hi.view(1, -1) > pos - sel.window_tokens) | whole
            forced[:, c : c + n] = must & seen.view(-1, 1)
            c += n
        usable = self.length > 0
        self.forced = forced & usable
        self.context = (visible & usable).long() @ self.length  # (R,) resident context tokens per row
        width = max(int(self.forced.sum(1).max()) if r else 0, 1)
        order = torch.sort(self.forced.int(), dim=1, descending=True, stable=True).indices[:, :width]
        self.forced_ids = torch.where(self.forced.gather(1, order), order, -1)
        device = self.batch.pool.device
        if self.owner.on_demand:
            self.hosted = torch.zeros(self.n_chunks, dtype=torch.bool, device=device)
            if self.hosted_ids:
                self.hosted[torch.cat(self.hosted_ids).to(device)] = True
            self.demand = torch.zeros(self.n_chunks, dtype=torch.float32, device=device)
        self.slots, self.target = self.slots.to(device), self.target.to(device)
        self.length, self.forced = self.length.to(device), self.forced.to(device)
        self.forced_ids = self.forced_ids.to(device)
        for plan in self.plans:
            plan.rows = None if plan.rows is None else plan.rows.to(device)

    # ---- per layer -----------------------------------------------------------------------------
    def attend(
        self, layer: int, qg: torch.Tensor, own_out: torch.Tensor, own_lse: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention over the chosen chunks, merged with the own-token partials.

        Args:
            qg: (R, H, g, D) queries grouped by KV head (q = 1).
            own_out / own_lse: (R, H, g, D) / (R, H, g) partials of the rows' own tokens.
        Returns:
            out (R, H, g, D) float32 and lse (R, H, g) over the chosen chunks and the own tokens;
            with statistics on, the chosen keys' attention mass is added to their pieces.
        """
        owner = self.owner
        start = owner.clock()
        chosen, take = self._select(layer, qg)  # (R, H, K) step chunk ids, bool
        mid = owner.clock()
        slots = self.slots[chosen]  # (R, H, K, W)
        valid = (slots >= 0) & take.unsqueeze(-1)
        r, h, k, w = slots.shape
        slots, valid = slots.view(r, h, k * w), valid.view(r, h, k * w)
        keys, values = _gather_heads(self.batch.pool, layer, slots.clamp(min=0), self.batch.groups)
        q = qg.float()
        scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scale  # (R, H, g, S)
        scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.matmul(torch.softmax(scores, dim=-1).nan_to_num_(0.0), values.float())
        out, lse = merge_partials(own_out, own_lse, out, lse)
        if self.batch.stats:
            self._collect(scores, lse, chosen, valid)
        owner.stats.index_seconds += mid - start
        owner.stats.attention_seconds += owner.clock() - mid
        owner.stats.read_tokens += int(valid.sum())
        owner.stats.context_tokens += int(self.context.sum()) * h
        return out, lse

    def _select(self, layer: int, qg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row and KV head, the chunks to read: (R, H, K) step chunk ids and which are taken."""
        sel = self.owner.select
        r, h = qg.shape[0], qg.shape[1]
        q = qg.float()
        forced = self.forced_ids.unsqueeze(1).expand(r, h, -1)
        ids = [forced.clamp(min=0)]
        scores = [torch.where(forced >= 0, float("inf"), float("-inf"))]
        retrieved = []  # (ids, bounds) before resident-only masking, for the rehydration demand
        for plan in self.plans:
            sub = q if plan.rows is None else q.index_select(0, plan.rows)
            got, best = plan.index.retrieve(layer, sub, plan.n, sel.exact)  # (r', H, m)
            got = got + plan.offset
            if plan.rows is not None:
                got = torch.zeros(r, h, got.shape[-1], dtype=got.dtype).index_copy_(0, plan.rows, got)
                best = torch.full((r, h, best.shape[-1]), float("-inf")).index_copy_(0, plan.rows, best)
            again = self.forced.gather(1, got.view(r, -1)).view_as(got) | (self.length[got] == 0)
            retrieved.append((got, best))
            ids.append(got)
            scores.append(best.masked_fill(again, float("-inf")))
        ids, scores = torch.cat(ids, -1), torch.cat(scores, -1)
        scores, order = scores.sort(dim=-1, descending=True)
        ids = ids.gather(-1, order)
        size = self.length[ids]
        before = size.cumsum(-1) - size
        take = torch.isfinite(scores) & (before < sel.token_budget) | (scores == float("inf"))
        if self.demand is not None and retrieved:
            self._count_demand(retrieved, scores, take, size)
        k = max(int(take.sum(-1).max()), 1)
        return ids[..., :k], take[..., :k]

    def _count_demand(self, retrieved, scores: torch.Tensor, take: torch.Tensor, size: torch.Tensor) -> None:
        """Count, per hosted chunk, the (row, KV head) selections of this layer it would have entered
        if resident: its bound reaches the lowest bound taken, or the selection did not fill the budget.

        Args:
            retrieved: per indexed block, (ids (R, H, m) step chunk ids, bounds (R, H, m)).
            scores / take / size: (R, H, K) the sorted selection, what was taken, resident tokens.
        """
        finite = torch.isfinite(scores)
        lowest = torch.where(take & finite, scores, float("inf")).amin(-1, keepdim=True)  # (R, H, 1)
        filled = (size * take).sum(-1, keepdim=True) >= self.owner.select.token_budget
        lowest = torch.where(filled, lowest, float("-inf"))
        for got, best in retrieved:
            want = self.hosted[got] & torch.isfinite(best) & (best >= lowest)
            if bool(want.any()):
                self.demand.index_add_(0, got[want], torch.ones(int(want.sum()), device=got.device))

    def _collect(self, scores: torch.Tensor, lse: torch.Tensor, chosen: torch.Tensor, valid: torch.Tensor) -> None:
        """Attention mass of the gathered keys into their blocks' pieces (``Group.mass``)."""
        r, h, k = chosen.shape
        mass = torch.exp(scores - lse.unsqueeze(-1)).sum(2)  # (R, H, S): zero where masked
        target = self.target[chosen].view(r, h, -1)
        flat = torch.zeros(self.n_tokens, dtype=torch.float32, device=mass.device)
        flat.index_add_(0, target[valid], mass[valid])
        for grp, offsets in zip(self.batch.groups, self.piece_offsets, strict=True):
            for i, (piece, off) in enumerate(zip(grp.pieces, offsets, strict=True)):
                grp.mass[i] += flat[off : off + piece.length]


# ---- helpers ---------------------------------------------------------------------------------
def _layout(grp: Group, index: BlockIndex | None, width: int):
    """One block's chunk tables from its pieces.

    Returns slots (C, W) pool slots of each chunk's resident tokens (-1 padded), target (C, W)
    each token's place in the concatenation of the block's pieces, and the chunks' block-local
    token ranges lo / hi (C,). A block read whole is cut into runs of ``width`` resident tokens.
    """
    idx = torch.cat([p.idx for p in grp.pieces])
    slot = torch.cat([torch.arange(p.start, p.start + p.length) for p in grp.pieces])
    order = torch.argsort(idx)
    if index is None:  # read whole: runs of ``width`` resident tokens, positions unused
        chunk = torch.arange(int(idx.numel())) // width
        c = -(-int(idx.numel()) // width)
        lo = hi = torch.zeros(c, dtype=torch.long)
    else:
        chunk = torch.searchsorted(index.starts, idx[order], right=True) - 1
        c = index.n_chunks
        lo, hi = index.starts[:-1], index.starts[1:]
    first = torch.searchsorted(chunk, chunk, right=False)
    rank = torch.arange(int(idx.numel())) - first
    slots = torch.full((c, width), -1, dtype=torch.long)
    target = torch.full((c, width), -1, dtype=torch.long)
    slots[chunk, rank] = slot[order]
    target[chunk, rank] = order
    return slots, target, lo, hi


def _gather_heads(pool, layer: int, slots: torch.Tensor, groups) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at per-head slots (R, H, S) of one layer: (R, H, S, D) each (a copy).

    Restores in flight into the context's segments are waited for first (on CUDA, per layer).
    """
    prefetcher = getattr(pool, "prefetcher", None)
    if prefetcher is not None and prefetcher.busy:
        for grp in groups:
            for p in grp.pieces:
                prefetcher.wait(layer, p.start, p.start + p.length)
    r, h, s = slots.shape
    heads = torch.arange(h, device=slots.device).view(1, h, 1)
    d = pool.shape.head_dim
    keys = values = None
    for arena in pool.arenas:  # the first arena gathers every slot; the others fix up their own few
        cap = arena.capacity
        keys_l = arena.keys[layer].reshape(h * cap, d)  # (H * cap, D)
        values_l = arena.values[layer].reshape(h * cap, d)
        flat = ((slots - arena.base).clamp(0, cap - 1) + heads * cap).reshape(-1)
        if keys is None:
            keys, values = keys_l.index_select(0, flat), values_l.index_select(0, flat)
            continue
        pick = torch.nonzero(((slots >= arena.base) & (slots < arena.end)).reshape(-1)).squeeze(1)
        if pick.numel():
            rows = flat.index_select(0, pick)
            keys.index_copy_(0, pick, keys_l.index_select(0, rows))
            values.index_copy_(0, pick, values_l.index_select(0, rows))
    return keys.view(r, h, s, d), values.view(r, h, s, d)
