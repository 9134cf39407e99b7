"""The runner: the tensor side of a prefill-style forward (prompt, forced block, chunk, recompute, choose).

It builds the :class:`~arbor_runtime.attention.tree.TreeBatch` over context blocks, runs the backend and
charges the time to the work being carried out, adds the forward's attention mass to the blocks it
read, and gives pool slots back. It decides nothing: what to forward, where its KV goes and whether
it fits were settled before (the memory manager's admission).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from arbor_runtime.attention.tree import TreeBatch, context_groups
from arbor_runtime.backend import ModelBackend
from arbor_runtime.kv import Extent, KVStore

if TYPE_CHECKING:
    from arbor_runtime.accounts import Accounts
    from arbor_runtime.planner import MemoryPlanner


class Runner:
    """Forwards over stored blocks for one runtime.

    Args:
        store: the block store (pool slots, attention records); backend: the model runner;
        planner: says how attention records are kept (added up, or replaced under a window);
        accounts: whose current work a forward's time is charged to.
    """

    def __init__(self, store: KVStore, backend: ModelBackend, planner: MemoryPlanner, accounts: Accounts) -> None:
        self.store, self.backend, self.planner, self.accounts = store, backend, planner, accounts

    def batch(
        self, contexts: list[list[int]], q: int, write: torch.Tensor, stats: bool, stats_from: int = 0
    ) -> TreeBatch:
        """A batch of R = ``len(contexts)`` rows of ``q`` new tokens, row r reading blocks ``contexts[r]``.

        ``write``: (R, q) pool slots for the new tokens' KV (-1: not stored); ``stats``: record
        attention mass, from query ``stats_from`` on.
        """
        groups, kernel = context_groups(self.store, contexts), self.backend.kernel
        return TreeBatch(
            self.store.pool,
            groups,
            len(contexts),
            q,
            write,
            stats=stats,
            kernel=kernel,
            stats_from=stats_from,
            head_stats=self.store.head_stats,
        )

    def forward(self, batch: TreeBatch, ids: torch.Tensor, positions: torch.Tensor, keep: int) -> torch.Tensor:
        """A prefill-style forward, its time charged to the current work's account.

        ids, positions: (R, q); returns (R, keep, V) logits (``keep`` = 0: every position).
        """
        start = time.perf_counter()
        logits = self.backend.forward(batch, ids, positions, keep)
        work = self.accounts.work
        acc = work.account if work is not None else None
        if acc is not None:
            acc.metrics.forward_calls += 1
            acc.metrics.model_seconds += time.perf_counter() - start
        return logits

    def take_attention(self, batch: TreeBatch) -> None:
        """Add a forward's attention mass over context blocks to those blocks (queries counted once per block).

        Under an observation window the new record replaces the old one of every token it saw.
        """
        if not batch.stats:
            return
        queries, windowed = batch.q - batch.stats_from, self.planner.windowed
        for grp in batch.groups:
            for i, (piece, mass) in enumerate(zip(grp.pieces, grp.mass, strict=True)):
                if windowed and piece.block_id in self.store:
                    self.store.get(piece.block_id).attention[piece.idx] = 0.0
                if batch.head_stats:  # (L, H_kv, n): each head's mass to the tokens it holds in these slots
                    self.store.add_head_attention_at(piece.block_id, piece.start, mass, replace=windowed)
                    mass = mass.sum(dim=(0, 1))
                self.store.add_attention(piece.block_id, piece.idx, mass, grp.n_rows * queries if i == 0 else 0.0)

    def free_slots(self, extents: Sequence[Extent]) -> None:
        """Give pool slots back (a row's spare page, a failed forward's allocation)."""
        for ext in extents:
            self.store.pool.free(ext)
