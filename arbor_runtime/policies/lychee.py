"""LycheeCluster (Li et al. 2026, arXiv 2603.08453): boundary-aware chunks, a centroid + radius
hierarchy per layer and KV head, decode queries read the chunks the triangle-inequality bound
ranks highest (plus sinks and a recent window). Wraps a memory policy (see ``sparse.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from arbor_runtime.policies.sparse import SparsePolicy
from arbor_runtime.sparse import ChunkTree, TreeConfig
from arbor_runtime.sparse.tree import CHUNK_SCORES


@dataclass(slots=True)
class LycheePolicy(SparsePolicy):
    """LycheeCluster sparse decode attention.

    Attributes:
        token_share: as :class:`SparsePolicy`; 0.15 here (past ``dense_below``): of the read shares
            (10, 15, 25%) and chunkings measured at 8K on SmolLM2, 2-4-token chunks at 15% had the
            best agreement with dense x speed (docs/data/longctx-pilot49/; the default measured on
            the suite's 180 items at 8K: docs/data/longctx-default/, issue 49).
        min_chunk_tokens / max_chunk_tokens: chunk length bounds inside long blocks (2-4: at a 10%
            read the first answer token's KL to dense is 1.5x lower than with 4-8, at 8K; issue 49).
        dense_layers: as :class:`SparsePolicy`; ``"auto"`` here: the layers measured for the model
            (SmolLM2-135M-Instruct: [7], docs/data/longctx-layer7), none for a model not listed.
        index_reserve: as :class:`SparsePolicy`; 5% here (2-4-token chunks: an index of about 3.5%
            of fp32 K/V at 8K).
        drift_threshold: key drift (1 - cosine to the preceding keys) that starts a chunk; inf = off.
        fanout: children per index node; top_nodes: most nodes at the top of a block's hierarchy.
        oversample: subtrees kept per level, as a multiple of the chunks asked for.
        chunk_score: ``centroid`` (q.c) or ``axis`` (q.c + max(q.u hi, q.u lo): each chunk's principal
            axis of key deviations and their spread along it, so a lone key that matches the query is
            not averaged away; about 2x the index memory). See :class:`~arbor_runtime.sparse.TreeConfig`.
        flat_chunks: blocks of at most this many chunks are scanned flat (exact top-k by bound, one
            matmul); the hierarchy is descended above (and only then built). 4,096 (~12-16K tokens
            of 2-4-token chunks): on this CPU the flat scan costs less up to about 4,096 chunks
            (docs/notes/sparse.md).
    """

    name = "lychee"

    token_share: float = 0.15  # with 2-4-token chunks, past dense_below (issue 49)
    dense_layers: int | list[int] | str = "auto"  # the model's measured layers (sparse/calibrated.py), else none
    index_reserve: float = 0.05
    min_chunk_tokens: int = 2
    max_chunk_tokens: int = 4
    drift_threshold: float = float("inf")
    fanout: int = 8
    top_nodes: int = 64
    oversample: float = 2.0
    flat_chunks: int = 4096
    chunk_score: str = "centroid"

    def __post_init__(self) -> None:
        SparsePolicy.__post_init__(self)
        if self.chunk_score not in CHUNK_SCORES:
            valid = ", ".join(CHUNK_SCORES)
            raise ValueError(f"chunk_score={self.chunk_score!r}: how a chunk is scored; valid: {valid}")
        self.tree_config()  # validates the index knobs now

    def tree_config(self) -> TreeConfig:
        """The index shape these knobs give."""
        return TreeConfig(
            min_len=self.min_chunk_tokens,
            max_len=self.max_chunk_tokens,
            drift_threshold=float(self.drift_threshold),
            fanout=self.fanout,
            top_nodes=self.top_nodes,
            oversample=float(self.oversample),
            flat_chunks=int(self.flat_chunks),
            dtype=torch.int8,  # + a float16 scale per node: under 2% of fp32 K+V (docs/notes/sparse.md)
            radius_scale=float(self.bound_scale),
            score=self.chunk_score,
        )

    def index_builder(self):
        config = self.tree_config()
        return partial(ChunkTree.build, config), config.max_len
