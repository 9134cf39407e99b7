"""How much a sparse decode query reads: the read-budget rule and the layers read whole.

Two measured fixes (issue 24, docs/data/longctx/) for retrieval questions over a long context,
where a fixed 1,024-token budget changed SmolLM2's answer:

- the budget grows with the context: ``read_budget`` = max(floor, share x resident context),
  a floor above the context reads it all. :class:`BudgetedAttention` applies it per decode step, from the
  longest row's resident context (one budget per step: the selection is batched over rows).
- the first ``dense_layers`` layers read every resident chunk (Quest, Tang et al. 2024, keeps its
  first two layers dense: their attention is not sparse, and what they miss every later layer
  misses). :class:`DenseLayers` wraps a block index: at those layers its retrieval returns every
  chunk with an infinite bound, which the selection takes whatever the budget (as it takes the
  sinks and the window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from arbor_runtime.sparse import SparseAttention


def read_budget(context_tokens: int, floor: int, share: float) -> int:
    """Tokens a query reads of ``context_tokens`` resident ones: max(floor, ceil(share x context))
    (at least 1). Not capped at the context: the selection counts sinks and window inside the budget,
    so a budget of exactly the context can leave a chunk out, and a floor above the context must read
    it all, as it did before the share existed."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share={share} must be in [0, 1]")
    return max(1, int(floor), math.ceil(share * context_tokens))


class IndexWrapper:
    """A block index that wraps another: its chunks (``starts``, ``covered``, ``n_chunks``), ``nbytes``
    and ``update`` are the wrapped index's; a subclass changes how chunks are scored or retrieved.
    Args: index: a :class:`~arbor_runtime.sparse.attend.BlockIndex`."""

    __slots__ = ("index",)

    def __init__(self, index) -> None:
        self.index = index

    @property
    def starts(self) -> torch.Tensor:
        return self.index.starts

    @property
    def covered(self) -> torch.Tensor:
        return self.index.covered

    @property
    def n_chunks(self) -> int:
        return self.index.n_chunks

    @property
    def nbytes(self) -> int:
        return self.index.nbytes

    def update(self, *args, **kwargs) -> bool:
        return self.index.update(*args, **kwargs)


class DenseLayers(IndexWrapper):
    """A block index whose retrieval, at the layers in ``layers``, returns every chunk (bound +inf).

    Everything else (``starts``, ``covered``, ``n_chunks``, ``nbytes``, ``update``) is the wrapped
    index's. Args: index: a :class:`~arbor_runtime.sparse.attend.BlockIndex`; layers: the indices of
    the layers read whole.
    """

    __slots__ = ("layers",)

    def __init__(self, index, layers: frozenset[int]) -> None:
        IndexWrapper.__init__(self, index)
        self.layers = frozenset(layers)

    def __getattr__(self, name: str):
        return getattr(self.index, name)

    def scores(self, layer: int, q: torch.Tensor) -> torch.Tensor | None:
        """(r, H, C): +inf at a dense layer, else the wrapped index's scores (None: it does not scan flat)."""
        if layer not in self.layers:
            return self.index.scores(layer, q)
        return torch.full((q.shape[0], q.shape[1], self.index.n_chunks), float("inf"), device=q.device)

    def retrieve(self, layer: int, q: torch.Tensor, n: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (r, H, m) and bounds (r, H, m) for queries q (r, H, g, D): at a dense layer every
        chunk (m = C) with bound +inf, else the wrapped index's top ``n``."""
        if layer not in self.layers:
            return self.index.retrieve(layer, q, n, exact)
        r, h, c = q.shape[0], q.shape[1], self.index.n_chunks
        ids = torch.arange(c, device=q.device).expand(r, h, c)
        return ids, torch.full((r, h, c), float("inf"), device=q.device)


#: ``dense_layers`` of a policy that reads the layers measured for its model (policies/sparse.py)
AUTO = "auto"


def dense_layer_set(layers: int | Sequence[int]) -> frozenset[int]:
    """``dense_layers`` as the set of layers read whole: an int n is the first n layers, a list those
    layers (``[7]``: the eighth alone). ValueError names a value that is neither."""
    if isinstance(layers, int) and not isinstance(layers, bool):
        if layers < 0:
            raise ValueError(f"dense_layers={layers!r} must be an integer >= 0, a list of layer indices or {AUTO!r}")
        return frozenset(range(layers))
    if isinstance(layers, str | bytes) or not isinstance(layers, Sequence):
        raise ValueError(f"dense_layers={layers!r} must be an integer >= 0, a list of layer indices or {AUTO!r}")
    picked = list(layers)
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in picked) or len(set(picked)) < len(picked):
        raise ValueError(f"dense_layers={list(layers)!r}: a list must hold distinct layer indices >= 0")
    return frozenset(picked)


def dense_layers_builder(builder, layers: frozenset[int]):
    """``builder`` (keys, layers, resident, ends) -> index, its indexes wrapped in :class:`DenseLayers`
    reading ``layers`` whole (:func:`dense_layer_set` of a policy's ``dense_layers``)."""
    if not layers:
        return builder

    def build(*args, **kwargs):
        return DenseLayers(builder(*args, **kwargs), layers)

    return build


class BudgetedAttention(SparseAttention):
    """:class:`SparseAttention` whose ``token_budget`` follows :func:`read_budget` of the longest
    row's resident context at each decode step (``select.token_budget`` is the floor).

    Args: as :class:`SparseAttention`, plus share: the read share of the context.
    """

    def __init__(self, *args, share: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.floor, self.share = self.select.token_budget, float(share)
        read_budget(0, self.floor, self.share)  # validates the share

    def _read_budget(self, longest: int) -> int:
        return read_budget(longest, self.floor, self.share)
