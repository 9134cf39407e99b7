"""Batch data types: what one forward reads (a leaf; the attention hook, the sparse step and the backend share it).

A batch is R rows of q new tokens each. Its context is a list of :class:`Group` (a block and the
rows whose path holds it), each a list of :class:`Piece` (a run of pool slots of that block).
:class:`~arbor_runtime.attention.tree.TreeBatch` builds and attends them; :class:`BatchView` is the part
of it that the attention hook (attention/hook.py) and sparse decode (sparse/step.py) read, so that
neither imports the backend that runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from arbor_runtime.attention.call import AttentionCall
    from arbor_runtime.kv.pool import DevicePool


@dataclass(slots=True)
class Piece:
    """One pool segment of a context block: slots [start, start + length), token ids ``idx``."""

    block_id: int
    start: int
    idx: torch.Tensor  # (length,) block-local token indices held in those slots

    @property
    def length(self) -> int:
        return int(self.idx.numel())


@dataclass(slots=True)
class Group:
    """A context block and the batch rows whose path holds it (``rows`` None = every row).

    ``start_pos``: the block's first token's position: a piece's keys sit at ``start_pos + idx``
    (what a sliding window is measured on).
    """

    block_id: int
    rows: torch.Tensor | None
    n_rows: int
    pieces: list[Piece]
    mass: list[torch.Tensor] | None = None  # per piece (length,) float32 when statistics are on
    start_pos: int = 0


class BatchView(Protocol):
    """What readers of a :class:`~arbor_runtime.attention.tree.TreeBatch` see of it.

    Attributes:
        pool: the device pool holding every context token.
        groups: context blocks with their rows and segments.
        rows: R, the batch rows.
        stats: attention statistics are collected (``Group.mass``).
        context_ids: decode steps: each row's context block ids in path order; else None.
    """

    pool: DevicePool
    groups: list[Group]
    rows: int
    stats: bool
    context_ids: list[list[int]] | None

    def attend(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, call: AttentionCall
    ) -> torch.Tensor:
        """query (R, Hq, q, D); key/value (R, H_kv, q, D); ``call``: the softmax the layer asks for.
        Returns (R, q, Hq, D) in the query dtype."""
        ...
