"""The oracle selector: each decode query reads the resident keys with the highest true score q.k.

A measuring tool, not a method: it scores every resident key of the context at every layer of every
decode step (what an index exists to avoid), so it is slower than dense attention. What it gives is
a bound at a read budget: with the same read rule as ``lychee`` and ``quest`` (the same budget, sinks,
window, blocks read whole and own tokens; :mod:`~arbor_runtime.sparse.reads`), the gap from the oracle
to an index is the index's loss, the gap from dense to the oracle is sparsity's.

It is a selector inside the same sparse step, not a second attention path: every block is indexed
with one chunk per token (:class:`TokenIndex`, no statistics), and :class:`OracleStep` replaces the
index's estimate by the exact score, per KV head group: ``max over the group's g query heads of q.k``
(lychee's and quest's scores take the same max over the group), so the selection's sort and budget
cut take the exact top-k keys. Its scratch grows with the context (the context's keys of one layer
and rows x heads x context scores): for measuring, not for budgeted runs.
"""

from __future__ import annotations

import torch

from arbor_runtime.sparse.reads import IndexWrapper
from arbor_runtime.sparse.step import SparseStep, gather_heads


class TokenIndex:
    """A block's "index" for the oracle: one chunk per token, no key statistics (``nbytes`` 0).

    Attributes:
        starts: (T + 1,) long chunk boundaries (every token its own chunk).
        covered: (T,) bool, tokens the index has seen resident.
    """

    def __init__(self, length: int) -> None:
        self.starts = torch.arange(length + 1)
        self.covered = torch.zeros(length, dtype=torch.bool)

    @classmethod
    def build(cls, keys, layers: int, resident: torch.Tensor, ends: torch.Tensor) -> TokenIndex:
        """One chunk per token of a block of ``len(ends)`` tokens (the keys are not read)."""
        index = cls(0)
        index.update(keys, layers, resident, ends)
        return index

    @property
    def n_chunks(self) -> int:
        return self.starts.numel() - 1

    @property
    def nbytes(self) -> int:
        """Nothing on the accelerator: the oracle reads the pool's keys themselves."""
        return 0

    def update(self, keys, layers: int, resident: torch.Tensor, ends: torch.Tensor) -> bool:
        """Grow to ``len(ends)`` tokens and mark ``resident`` (T_res,) as seen; True when anything changed."""
        length, old = int(ends.numel()), int(self.covered.numel())
        fresh = resident[resident >= old] if length > old else resident[~self.covered[resident]]
        if length == old and not fresh.numel():
            return False
        self.starts = torch.arange(length + 1)
        self.covered = torch.cat([self.covered, torch.zeros(length - old, dtype=torch.bool)])
        self.covered[resident] = True
        return True

    def scores(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """(r, H, T) zeros: no estimate (:class:`OracleStep` adds the exact q.k; a dense layer's
        wrapper, :class:`~arbor_runtime.sparse.reads.DenseLayers`, puts +inf here)."""
        return torch.zeros(q.shape[0], q.shape[1], self.n_chunks, device=q.device)

    def retrieve(self, layer: int, q: torch.Tensor, n: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Never used: the oracle's step always selects flat (it runs no on-demand ranking)."""
        raise NotImplementedError("the oracle selects by exact scores in OracleStep, not by candidate lists")


class ChunkBoundaries(IndexWrapper):
    """Another index's chunks without its estimate: the oracle over lychee's chunk boundaries.

    :class:`OracleStep` then scores each of these chunks by the exact highest q.k of its keys, so the
    oracle reads whole chunks as lychee does: the gap from the token oracle to this one is what the chunk
    boundaries lose, the gap from this one to lychee what its centroid score loses (issue 49). Its
    chunks and ``update`` (the chunks may be re-cut as the block grows) are the wrapped index's
    (:class:`~arbor_runtime.sparse.reads.IndexWrapper`), its statistics unused.

    Attributes:
        index: the wrapped index (e.g. :class:`~arbor_runtime.sparse.tree.ChunkTree`).
    """

    __slots__ = ()

    @classmethod
    def builder(cls, build):
        """``build`` (keys, layers, resident, ends) -> index, wrapped: the same arguments, a ChunkBoundaries."""

        def build_boundaries(keys, layers: int, resident: torch.Tensor, ends: torch.Tensor) -> ChunkBoundaries:
            return cls(build(keys, layers, resident, ends))

        return build_boundaries

    @property
    def nbytes(self) -> int:
        """Nothing counted: a measuring tool (the oracle reads the pool's keys themselves)."""
        return 0

    def scores(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """(r, H, C) zeros, as :meth:`TokenIndex.scores`: the exact scores are :class:`OracleStep`'s."""
        return torch.zeros(q.shape[0], q.shape[1], self.n_chunks, device=q.device)

    def retrieve(self, layer: int, q: torch.Tensor, n: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Never used: the oracle's step always selects flat."""
        raise NotImplementedError("the oracle selects by exact scores in OracleStep, not by candidate lists")


class OracleStep(SparseStep):
    """A :class:`SparseStep` whose chunk scores are exact: the highest q.k over each chunk's resident
    keys and the group's query heads (with :class:`TokenIndex` chunks, each key's own score)."""

    def _select(self, layer: int, qg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Always the flat selection (one sort and the budget cut), over the exact scores."""
        return self._select_flat(layer, qg)

    def _flat_scores(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """(R, H, C) the indexes' part (0, or +inf at a dense layer) plus the exact scores."""
        return SparseStep._flat_scores(self, layer, q).add_(self.exact_scores(layer, q))

    def exact_scores(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """(R, H, C) float32: per step chunk, the highest :func:`key_scores` of its keys; -inf for a
        chunk with no resident key."""
        c, w = self.slots.shape
        return key_scores(self, layer, q).view(q.shape[0], q.shape[1], c, w).amax(-1)


class RecallStep(SparseStep):
    """A :class:`SparseStep` (an index's selection, unchanged) that also measures, at every layer, the
    selection's recall of the oracle's: of the keys the exact top-k would retrieve beyond what both
    always read (sinks, window, blocks read whole), the share this selection reads too. Appends
    (layer, recall, per-KV-head recalls) to ``owner.recall`` (a list the caller puts on the sparse
    attention). Scores every key: for measuring (benchmarks/longctx)."""

    def _select(self, layer: int, qg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chosen, take = SparseStep._select(self, layer, qg)
        if self.base is not None:
            self.owner.recall.append((layer, *self.recall(layer, qg, chosen, take)))
        return chosen, take

    def recall(
        self, layer: int, qg: torch.Tensor, chosen: torch.Tensor, take: torch.Tensor
    ) -> tuple[float, list[float | None]]:
        """|oracle's retrieved keys read by (chosen, take) (R, H, K)| / |oracle's retrieved keys|, over rows
        and KV heads (1.0 when the oracle retrieves nothing beyond the forced keys), and the same per KV
        head over rows (None for a head where it retrieves nothing)."""
        c, w = self.slots.shape
        r, h = qg.shape[0], qg.shape[1]
        slots = self.slots.reshape(1, 1, c * w)
        exact = key_scores(self, layer, qg.float())  # (R, H, C * W)
        base = self.base.repeat_interleave(w, dim=-1)  # (R, 1, C * W): +inf forced, -inf unreadable
        # inf - inf (a forced chunk's padding): unread; the infinities stay infinite (nan_to_num's defaults
        # would make them the largest / lowest finite floats, counting forced and unreadable keys as wanted)
        scores = (exact + base).masked_fill(slots < 0, float("-inf"))
        scores = scores.nan_to_num_(float("-inf"), float("inf"), float("-inf"))
        order = scores.sort(dim=-1, descending=True)
        rank = torch.arange(c * w, device=exact.device)
        top = torch.isfinite(order.values) & (rank < self.owner.select.token_budget)
        top |= order.values == float("inf")
        oracle = torch.zeros_like(top).scatter_(-1, order.indices, top) & torch.isfinite(scores)  # retrieved only
        read = torch.zeros(r, h, c, dtype=torch.int32, device=exact.device).scatter_add_(-1, chosen, take.int())
        read = (read > 0).repeat_interleave(w, dim=-1)  # (R, H, C * W): padding ids carry take False
        hits, wanted = (oracle & read).sum(dim=(0, 2)), oracle.sum(dim=(0, 2))  # (H,) each
        heads = [float(x) / int(n) if int(n) else None for x, n in zip(hits, wanted, strict=True)]
        total = int(wanted.sum())
        return (float(hits.sum()) / total if total else 1.0), heads


def key_scores(step: SparseStep, layer: int, q: torch.Tensor) -> torch.Tensor:
    """(R, H, C * W) float32: each of the step's key slots' score, max over the g query heads of
    q (R, H, g, D) of q.k (unscaled: the order is the softmax's); -inf at padding (no resident key)."""
    c, w = step.slots.shape
    h = q.shape[1]
    slots = step.slots.reshape(1, 1, c * w).expand(1, h, c * w)
    (keys,) = gather_heads(step.batch.pool, layer, slots.clamp(min=0), step.batch.groups, ("keys",))  # (1, H, S, D)
    dots = torch.matmul(q, keys.float().transpose(-1, -2)).amax(2)  # (R, H, S)
    return dots.masked_fill(slots < 0, float("-inf"))
