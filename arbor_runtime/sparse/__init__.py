"""Sparse decode attention: chunk indexes over blocks (LycheeCluster, Quest) and the attention that reads them."""

from arbor_runtime.sparse.attend import SparseAttention
from arbor_runtime.sparse.chunking import BoundaryTable, chunk_starts, key_drift, page_starts
from arbor_runtime.sparse.index import SelectConfig, SparseStats
from arbor_runtime.sparse.pages import PageIndex
from arbor_runtime.sparse.step import SparseStep
from arbor_runtime.sparse.tree import ChunkTree, TreeConfig

__all__ = [
    "BoundaryTable",
    "ChunkTree",
    "PageIndex",
    "SelectConfig",
    "SparseAttention",
    "SparseStats",
    "SparseStep",
    "TreeConfig",
    "chunk_starts",
    "key_drift",
    "page_starts",
]
