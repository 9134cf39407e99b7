"""Block indexes for sparse decode: one per block, built the first time a decode step reads the
block, updated lazily when the block gains tokens, dropped with the block.

Blocks shorter than ``min_block_tokens`` are read whole (not indexed). Index memory counts in
the budget: with a budget the indexes may hold at most ``reserve_bytes`` (the pool is smaller by
as many token slots); a block whose index would not fit is read whole. On demand (a sparse
policy's ``rehydrate=ranked``) an index covers the host-tier tokens of its block too (their keys
are read from the host).

Also the types the step (step.py) and the rehydration demand (demand.py) share: what an index
offers (:class:`BlockIndex`), what a query reads (:class:`SelectConfig`), the running totals
(:class:`SparseStats`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from arbor_runtime.sparse import native
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

    def scores(self, layer: int, q: torch.Tensor) -> torch.Tensor | None: ...


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
        dense_below: a step whose longest row holds fewer resident context tokens is attended dense.
        rerank: 0 (off) or a factor >= 1: the chunks are cut at ``rerank x token_budget`` tokens (the
            candidates), then every candidate key is scored exactly (max over the group's query heads
            of q.k, the attention's own scores) and the best ``token_budget`` of them are read.
    """

    token_budget: int = 1024
    sink_tokens: int = 16
    window_tokens: int = 64
    min_block_tokens: int = 64
    exact: bool = False
    width: int = 16
    dense_below: int = 0
    rerank: float = 0.0

    @property
    def candidate_tokens(self) -> int:
        """Tokens the chunk selection takes per row and KV head: the read budget, or with ``rerank``
        that many times it (the candidates whose keys are scored exactly)."""
        return math.ceil(self.rerank * self.token_budget) if self.rerank else self.token_budget


@dataclass(slots=True)
class SparseStats:
    """Running totals of a runtime's sparse decode steps (seconds are summed over layers)."""

    steps: int = 0
    dense_steps: int = 0  # steps whose budget covered every row's resident context: attended dense
    index_seconds: float = 0.0  # layout (per step) + retrieval and selection (per layer)
    layout_seconds: float = 0.0  # the per-step layout alone (outside the attention layers)
    attention_seconds: float = 0.0
    build_seconds: float = 0.0
    read_tokens: int = 0  # context tokens attended, summed over rows, KV heads and layers
    context_tokens: int = 0  # resident context tokens a dense step would attend, same sums
    scored_tokens: int = 0  # with rerank: candidate context keys scored exactly, same sums
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
class IndexEntry:
    """A block as the sparse layer knows it: its index (None = read whole) and its cached layout."""

    index: BlockIndex | None
    length: int
    layout_key: tuple = ()
    layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None


@dataclass(slots=True)
class GroupPlan:
    """An indexed context block of a step: its index, rows (None = all), first chunk id, chunks asked."""

    index: BlockIndex
    rows: torch.Tensor | None
    offset: int
    n: int
    block_id: int = -1


class BlockIndexes:
    """The per-runtime indexes over blocks, and their accounting (see module docstring).

    Args:
        builder: builds one block's index.
        select: what a query reads.
        store: the block store (its pool holds every K/V read here).
        token_ids: block id -> its token ids (sentence ends come from their text).
        decode: token ids -> text (a tokenizer's ``decode``), None when there is no text.
        reserve_bytes: most bytes the indexes may hold (None: no cap).
        on_demand: indexes also cover the host-tier tokens of their block (for rehydration ranking).
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
        self.floor = select.token_budget  # the configured budget (``select``'s changes per step)
        self.token_ids, self.reserve_bytes, self.on_demand = token_ids, reserve_bytes, on_demand
        self.boundaries = BoundaryTable(decode)
        self.entries: dict[int, IndexEntry] = {}
        self.stats = SparseStats()
        #: the clock of the stats' seconds (benchmarks on a shared CPU use ``time.thread_time``)
        self.clock: Callable[[], float] = time.perf_counter
        #: the fast step: one flat selection over every chunk's score when the indexes scan flat, and
        #: the own tokens attended in the same softmax (False: candidate lists and a merged own pass,
        #: as before issue 24; kept for the side-by-side speed check and as the on-demand path)
        self.fast = True
        #: a step whose read budget covers every row's resident context is attended dense (False: it
        #: goes through the selection, which then takes every chunk: the tests of the sparse path)
        self.dense_when_covered = True
        #: layers every index reads whole (a policy's ``dense_layers``): the backend attends them dense,
        #: as it attends a step whose budget covers the context (but on demand, where every layer counts)
        self.whole_layers: frozenset[int] = frozenset()
        #: the fast step reads the chosen K/V in place with the CPU kernel (native.py): None until the
        #: first step asks (:meth:`native_read`), False keeps the torch gather (the side-by-side check)
        self.native: bool | None = None

    def native_read(self) -> bool:
        """Whether the fast step's read goes through :func:`~arbor_runtime.sparse.native.gather_attend`
        (decided once: a CPU float32 pool and a kernel that builds)."""
        if self.native is None:
            self.native = native.available(self.store.pool)
        return self.native

    # ---- indexes -------------------------------------------------------------------------------
    def _entry(self, block_id: int) -> IndexEntry:
        """The block's entry, its index built or lazily updated to what is resident now."""
        blk = self.store.get(block_id)
        entry = self.entries.get(block_id)
        if entry is not None and entry.index is None and entry.length == blk.length:
            return entry  # read whole
        if entry is None and blk.length < self.select.min_block_tokens:
            entry = self.entries[block_id] = IndexEntry(None, blk.length)
            return entry
        start = self.clock()
        resident = self._known(block_id)
        if entry is None or entry.index is None:
            index = self._build(block_id, resident, blk.length)
            entry = self.entries[block_id] = IndexEntry(index, blk.length)
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

    def _ends(self, block_id: int) -> torch.Tensor:
        return self.boundaries.ends(self.token_ids(block_id))

    @property
    def nbytes(self) -> int:
        """Bytes the indexes hold now."""
        return self.stats.index_bytes
