"""Sparse decode attention: each decode query reads the sinks, the recent window and the chunks
its block indexes rank highest, and nothing else of the context.

One :class:`SparseAttention` per runtime holds an index per block (built the first time a decode
step reads the block, updated lazily when the block gains tokens, dropped with the block). For a
decode batch, :meth:`SparseAttention.prepare` lays out the step once (every context block's
chunks and the pool slots of their resident tokens, which chunks each row must read); then at
every layer :meth:`SparseStep.attend` selects each row's chunks per KV head and attends them (step.py says
how, in two passes: retrieval, then gather and attention merged by log-sum-exp).

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

Its parts, each in its own module: the block indexes and their accounting (index.py, the base
of :class:`SparseAttention`), the step's layout, selection and attention (step.py), and the
on-demand rehydration demand (demand.py). This module joins them; each name is imported from its
own module.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from arbor_runtime.batch import BatchView
from arbor_runtime.sparse.demand import away_blocks, wanted_spans
from arbor_runtime.sparse.index import BlockIndexes
from arbor_runtime.sparse.step import SparseStep

__all__ = ["SparseAttention", "row_contexts"]


class SparseAttention(BlockIndexes):
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

    #: the step :meth:`prepare` laid out last (None before the first)
    last_step: SparseStep | None = None
    #: the step class :meth:`prepare` lays out (the oracle's scores every key: oracle.py)
    step_type: type[SparseStep] = SparseStep

    # ---- per step ------------------------------------------------------------------------------
    def prepare(self, batch: BatchView, positions: torch.Tensor) -> SparseStep | None:
        """Lay out one decode step: positions (R,) are the rows' current token positions.

        None (the backend attends the step dense) when the read budget covers every row's resident
        context and nothing is ranked on demand: the selection would take every chunk, so the dense
        step reads the same tokens, exactly and without the selection's cost. The budget covers it
        too when the longest row's context is below ``select.dense_below`` (:meth:`_set_budget`)."""
        contexts = row_contexts(batch)  # (R,) resident context tokens
        longest = int(contexts.max()) if contexts.numel() else 0
        self._set_budget(longest)
        if self.dense_when_covered and not self.on_demand and self.select.token_budget >= longest:
            read = int(contexts.sum()) * self.store.shape.kv_heads * self.store.shape.layers
            self.stats.steps += 1
            self.stats.dense_steps += 1
            self.stats.read_tokens += read
            self.stats.context_tokens += read
            return None
        start, built = self.clock(), self.stats.build_seconds
        self._forget_released()
        step = self.step_type(self, batch)
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

    def _set_budget(self, longest: int) -> None:
        """Set this step's read budget from the longest row's resident context: :meth:`_read_budget`,
        or all of it when it is shorter than ``select.dense_below`` (dense, or on demand every resident
        chunk read while the host's are still ranked)."""
        budget = self._read_budget(longest)
        if longest < self.select.dense_below:
            budget = max(budget, longest)
        self.select = replace(self.select, token_budget=budget)

    def _read_budget(self, longest: int) -> int:
        """Tokens a query reads of a ``longest``-token context: the configured budget (fixed here)."""
        return self.floor

    def _away(self, batch: BatchView) -> list[tuple[int, torch.Tensor | None]]:
        """On demand: context blocks with every token on the host (no group in the batch), with the
        rows holding them (None = every row); their chunks are ranked for rehydration, not read."""
        return away_blocks(batch, self.store, self.on_demand)

    def wanted(self) -> list[tuple[int, torch.Tensor]]:
        """The last step's demand for evicted spans, most wanted first: (block id, its block-local
        tokens on the host). Blocks read whole come first (all their tokens are read; the most
        attended first, in pieces of a chunk's width), then the chunks by how many (layer, row, KV
        head) selections they would have entered (ties: block order, then position). Empty unless
        on demand; each step's demand is handed out once."""
        step, self.last_step = self.last_step, None
        if step is None:
            return []
        return wanted_spans(self.store, self.select.width, step.whole_blocks, step.plans, step.demand)


def row_contexts(batch: BatchView) -> torch.Tensor:
    """(R,) long: resident context tokens of each row of ``batch`` (its groups' pieces, per row)."""
    per_row = torch.zeros(batch.rows, dtype=torch.long)
    for grp in batch.groups:
        n = sum(int(p.length) for p in grp.pieces)
        if grp.rows is None:
            per_row += n
        else:
            per_row.index_add_(0, grp.rows.cpu(), torch.full((int(grp.rows.numel()),), n, dtype=torch.long))
    return per_row
