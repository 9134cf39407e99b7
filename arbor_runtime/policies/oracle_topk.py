"""The oracle bound for sparse decode attention: each query reads the exact top-k resident keys by
q.k at lychee's read budget (plus the sinks, window, short blocks and own tokens lychee always reads).

A measuring tool only: it scores every resident key at every layer of every decode step, so it is
slower than dense. The gap oracle -> lychee (or quest) at one setting is the index's loss, the gap
dense -> oracle sparsity's (issue 49). Wraps a memory policy like lychee (see ``sparse.py``); the
selector is ``arbor_runtime/sparse/oracle.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from arbor_runtime.policies.lychee import LycheePolicy
from arbor_runtime.policies.sparse import SparsePolicy
from arbor_runtime.sparse.oracle import ChunkBoundaries, OracleStep, TokenIndex

#: oracle_topk's ``chunks``: what one unit of its selection is
CHUNKS = ("token", "lychee")


@dataclass(slots=True)
class OracleTopKPolicy(SparsePolicy):
    """Exact top-k sparse decode attention (a bound, not a method: see the module docstring).

    Every knob is :class:`SparsePolicy`'s, read the same way; ``token_share`` defaults to lychee's
    (0.15), so at default settings it reads as many tokens as lychee (one-token chunks fill the budget
    exactly, lychee's last chunk may cross it by up to a chunk). ``exact`` and ``bound_scale`` have
    no effect (the scores are exact). ``rehydrate=ranked`` is refused: the oracle ranks nothing for
    the host tier. ``chunks``: ``token`` (the exact top-k keys) or ``lychee`` (lychee's chunks at its
    default knobs, each scored by its best key: what lychee's boundaries allow with a perfect score).
    """

    name = "oracle_topk"

    token_share: float = 0.15  # lychee's
    chunks: str = "token"

    def __post_init__(self) -> None:
        SparsePolicy.__post_init__(self)
        if self.rehydrate != "whole":
            raise ValueError(f"rehydrate={self.rehydrate!r}: policy=oracle_topk reads resident keys only; valid: whole")
        if self.chunks not in CHUNKS:
            raise ValueError(f"chunks={self.chunks!r}: the oracle's selection unit; valid: {', '.join(CHUNKS)}")

    def index_builder(self):
        if self.chunks == "token":
            return TokenIndex.build, 1
        build, width = LycheePolicy().index_builder()
        return ChunkBoundaries.builder(build), width

    def sparse_attention(self, store, token_ids, decode):
        attention = SparsePolicy.sparse_attention(self, store, token_ids, decode)
        attention.step_type = OracleStep
        return attention
