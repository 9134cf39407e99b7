"""LycheeCluster's index over one block: chunk centroids and radii in a hierarchy.

For every layer and KV head, each chunk of the block is summarized by the centroid ``c`` of its
keys and a radius ``r`` (no key of the chunk is farther than ``r`` from ``c``), so for any query

    q . k  <=  q . c + |q| r        for every key k of the chunk      (triangle inequality)

Chunks are grouped by balanced k-means into fine clusters, clusters into coarse units, until the
top level has at most ``top_nodes`` nodes. A node's radius covers its children's balls
(``R = max_child |c_child - C| + r_child``), so a node's bound is at least each child's bound: a
subtree whose bound is below what was already found holds nothing better.

Retrieval descends level by level as batched tensor ops: score every top-level node of every
KV head for every query at once, keep the best subtrees, gather their children, repeat; the
leaves found are the candidate chunks. ``exact=True`` adds a second, threshold pass (every
node whose bound reaches the k-th best leaf found so far is opened), which returns exactly the
top-k chunks by bound.

Centroids are stored in ``dtype``: int8 codes with one float16 scale per node (symmetric,
``c = code * scale``, ``scale = max|c| / 127``; the default), float16 or float32. Radii are
measured against the stored (dequantized) centroid and stored rounded up (float16 unless ``dtype``
is float32), so the bound holds for what is stored; parents cover their children's stored balls.
Child lists are int16 while the level below has fewer than 32768 nodes, int32 beyond.

A block that grows (or gets back tokens the index never saw) is updated lazily: the touched chunks
are recomputed, new chunks join the nearest existing cluster and the radii above them grow to cover
them; once more than ``rebuild_fraction`` of the chunks joined that way, the levels above the
chunks are rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from arbor_runtime.sparse import native
from arbor_runtime.sparse.chunking import chunk_starts, key_drift
from arbor_runtime.sparse.clustering import balanced_kmeans, member_lists, n_groups

#: keys(layer, tokens) -> (H, n, D): one layer's keys of the given block-local tokens
KeyReader = Callable[[int, torch.Tensor], torch.Tensor]
#: relative slack added to upper-level radii, so float rounding never makes a parent's bound
#: fall below its child's
SLACK = 1e-5
#: centroid storage choices (int8 carries one float16 scale per node)
CENTROID_DTYPES = (torch.int8, torch.float16, torch.float32)
#: largest int8 code of a centroid coordinate (symmetric: -127..127)
QMAX = 127
#: how a chunk is scored (``TreeConfig.score``)
CHUNK_SCORES = ("centroid", "axis")
#: power-iteration steps that find a chunk's principal axis (from its farthest key)
AXIS_STEPS = 3


@dataclass(frozen=True, slots=True)
class TreeConfig:
    """How a block is chunked and its hierarchy shaped.

    Attributes:
        min_len / max_len: chunk length bounds (tokens).
        drift_threshold: key drift (1 - cosine to the preceding keys, averaged over heads, at
            layer ``drift_layer``, -1 = the middle layer) that starts a new chunk; inf = off.
        fanout: children per node (about; at most ``ceil(1.25 fanout)``).
        top_nodes: levels are added until the top has at most this many nodes.
        oversample: at each level, keep subtrees holding about this many times the leaves asked.
        flat_chunks: a block of at most this many chunks is scanned flat (every chunk's bound in
            one matmul: exactly the top-k); larger blocks descend the hierarchy. 0 = always descend.
        rebuild_fraction: rebuild the upper levels once this share of the chunks joined lazily.
        dtype: storage of centroids: int8 (+ one float16 scale per node), float16 or float32;
            radii are float32 with float32 centroids, float16 (rounded up) otherwise.
        radius_scale: a chunk's score is ``q.c + radius_scale |q| r``: 1 is the triangle bound,
            below 1 an estimate (the bound over-ranks wide chunks: the |q| r term, the same for
            any query direction, outweighs q.c at head dim 64). Upper levels keep the true
            bound, which still covers every child's score, so ``exact`` stays exact for it.
        score: ``centroid`` (q.c, plus the radius term above) or ``axis``: the chunk also stores the
            first principal axis u of its keys' deviations k - c and their largest / smallest
            projection hi / lo on it, and scores ``q.c + max(q.u hi, q.u lo)`` (+ the radius term):
            the best key of the chunk exactly when its keys deviate from c along one direction, where
            the centroid averages a lone matching key away. Never above the bound, so the upper
            levels still cover it. Costs a second int8 vector per chunk (index memory about 2x).
    """

    min_len: int = 8
    max_len: int = 16
    drift_threshold: float = float("inf")
    drift_layer: int = -1
    fanout: int = 8
    top_nodes: int = 64
    oversample: float = 2.0
    flat_chunks: int = 0
    rebuild_fraction: float = 0.25
    dtype: torch.dtype = torch.int8
    radius_scale: float = 1.0
    score: str = "centroid"

    def __post_init__(self) -> None:
        if self.score not in CHUNK_SCORES:
            raise ValueError(f"score={self.score!r}; valid: {', '.join(CHUNK_SCORES)}")
        if not 0.0 <= self.radius_scale <= 1.0:
            raise ValueError(f"radius_scale={self.radius_scale} must be in [0, 1]")
        if self.dtype not in CENTROID_DTYPES:
            raise ValueError(f"dtype={self.dtype} must be one of {', '.join(map(str, CENTROID_DTYPES))}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"chunk lengths must satisfy 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")
        if self.fanout < 2 or self.top_nodes < 1:
            raise ValueError(f"fanout={self.fanout} must be >= 2 and top_nodes={self.top_nodes} >= 1")
        if self.oversample < 1.0:
            raise ValueError(f"oversample={self.oversample} must be >= 1")
        if self.flat_chunks < 0:
            raise ValueError(f"flat_chunks={self.flat_chunks} must be >= 0")

    @property
    def cap(self) -> int:
        return -(-5 * self.fanout // 4)

    @property
    def radius_dtype(self) -> torch.dtype:
        return torch.float32 if self.dtype == torch.float32 else torch.float16


@dataclass(slots=True)
class Axes:
    """Each chunk's principal axis and the spread of its keys along it (``TreeConfig.score='axis'``).

    Attributes:
        codes: (L, H, N, D) unit axes u in the storage dtype (int8 codes, float16 or float32).
        scales: (L, H, N) float16 per-node scales of int8 codes; None for float axes.
        spans: (L, H, N, 2) (hi, lo): the largest / smallest (k - c) . u over the chunk's keys, against
            the stored centroid and axis.
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    spans: torch.Tensor

    @classmethod
    def stack(cls, parts: list[Axes]) -> Axes:
        scales = None if parts[0].scales is None else torch.stack([a.scales for a in parts])
        return cls(torch.stack([a.codes for a in parts]), scales, torch.stack([a.spans for a in parts]))

    def units(self, layer: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``layer``'s axes dequantized to float32: (H, N, D), or (len(rows), D) for flat ids."""
        return dequantize(self.codes[layer], None if self.scales is None else self.scales[layer], rows)

    def grow(self, n: int) -> None:
        self.codes, self.spans = _grow(self.codes, n, 0), _grow(self.spans, n, 0.0)
        if self.scales is not None:
            self.scales = _grow(self.scales, n, 0.0)

    def put(self, ids: torch.Tensor, other: Axes) -> None:
        self.codes[:, :, ids] = other.codes
        self.spans[:, :, ids] = other.spans
        if self.scales is not None:
            self.scales[:, :, ids] = other.scales

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.spans) if t is not None)


@dataclass(slots=True)
class Level:
    """One level of the hierarchy, for every layer L and KV head H.

    Attributes:
        centroids: (L, H, N, D) in the storage dtype (int8 codes, float16 or float32).
        scales: (L, H, N) float16 per-node scales of int8 codes; None for float centroids.
        radii: (L, H, N) float16 or float32, rounded up, measured against the dequantized centroids.
        children: (L, H, N, M) int16 / int32 ids into the level below, -1 padded; None for the chunks.
        axes: the chunks' principal axes with ``score='axis'`` (chunks only), else None.
    """

    centroids: torch.Tensor
    scales: torch.Tensor | None
    radii: torch.Tensor
    children: torch.Tensor | None = None
    axes: Axes | None = None

    @classmethod
    def store(cls, centers: torch.Tensor, config: TreeConfig, children: torch.Tensor | None = None) -> Level:
        """A level holding float32 ``centers`` (..., N, D) quantized to ``config.dtype``, zero radii
        (the caller measures them against :meth:`centers` and stores them with :func:`round_up`)."""
        codes, scales = quantize(centers, config.dtype)
        return cls(codes, scales, torch.zeros(centers.shape[:-1], dtype=config.radius_dtype), children)

    @classmethod
    def stack(cls, levels: list[Level]) -> Level:
        """Per-layer levels (H, N, ...) stacked into one (L, H, N, ...) level (no child lists)."""
        scales = None if levels[0].scales is None else torch.stack([lvl.scales for lvl in levels])
        axes = None if levels[0].axes is None else Axes.stack([lvl.axes for lvl in levels])
        c, r = torch.stack([lvl.centroids for lvl in levels]), torch.stack([lvl.radii for lvl in levels])
        return cls(c, scales, r, None, axes)

    @property
    def size(self) -> int:
        return int(self.radii.shape[-1])

    def centers(self, layer: int | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The stored centroids dequantized to float32 (:func:`dequantize`).

        Args:
            layer: one layer (H, N, D), or None for every layer (L, H, N, D).
            rows: with ``layer``: flat ids ``head * N + node`` to gather, giving (len(rows), D).
        """
        codes, scales = self.centroids, self.scales
        if layer is not None:
            codes, scales = codes[layer], None if scales is None else scales[layer]
        return dequantize(codes, scales, rows)

    def grow(self, n: int) -> None:
        """Append n zero nodes (zero centroid, scale and radius) along the node dimension."""
        self.centroids, self.radii = _grow(self.centroids, n, 0), _grow(self.radii, n, 0.0)
        if self.scales is not None:
            self.scales = _grow(self.scales, n, 0.0)
        if self.axes is not None:
            self.axes.grow(n)

    def put(self, ids: torch.Tensor, other: Level) -> None:
        """Overwrite nodes ``ids`` with the nodes of ``other`` (same storage)."""
        self.centroids[:, :, ids] = other.centroids
        self.radii[:, :, ids] = other.radii
        if self.scales is not None:
            self.scales[:, :, ids] = other.scales
        if self.axes is not None:
            self.axes.put(ids, other.axes)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor of the level: centroids, scales, radii, child lists, axes."""
        parts = (self.centroids, self.scales, self.radii, self.children)
        axes = 0 if self.axes is None else self.axes.nbytes
        return sum(t.numel() * t.element_size() for t in parts if t is not None) + axes


class ChunkTree:
    """The index of one block (see module docstring).

    Attributes:
        starts: (C + 1,) long chunk boundaries in block-local tokens.
        levels: bottom-up; ``levels[0]`` are the chunks.
        covered: (T,) bool, tokens whose keys the chunk statistics include.
        grafted: chunks that joined lazily since the upper levels were built.
    """

    def __init__(self, config: TreeConfig, starts: torch.Tensor, levels: list[Level], covered: torch.Tensor) -> None:
        self.config, self.starts, self.levels, self.covered = config, starts, levels, covered
        self.grafted = 0

    # ---- building ----------------------------------------------------------------------------
    @classmethod
    def build(
        cls, config: TreeConfig, keys: KeyReader, layers: int, resident: torch.Tensor, ends: torch.Tensor
    ) -> ChunkTree:
        """Index a block from the keys of its resident tokens.

        Args:
            keys: reads one layer's keys of block-local tokens.
            layers: L.
            resident: (T_res,) sorted block-local tokens on the device.
            ends: (T,) bool, token closes a sentence or line (T = block length).
        """
        starts = chunk_starts(ends, config.min_len, config.max_len, *cls._drift(config, keys, layers, resident, ends))
        leaves = _leaf_stats(config, keys, layers, resident, starts, torch.arange(starts.numel() - 1))
        covered = torch.zeros(int(ends.numel()), dtype=torch.bool)
        covered[resident] = True
        tree = cls(config, starts, [leaves], covered)
        if tree.descends:
            tree._build_upper()
        return tree

    @staticmethod
    def _drift(config: TreeConfig, keys: KeyReader, layers: int, resident: torch.Tensor, ends: torch.Tensor):
        """(drift (T,), threshold) for chunk_starts; (None, inf) when drift cuts are off."""
        if config.drift_threshold == float("inf") or resident.numel() < 2:
            return None, float("inf")
        layer = config.drift_layer if config.drift_layer >= 0 else layers // 2
        drift = torch.zeros(int(ends.numel()))
        drift[resident] = key_drift(keys(layer, resident))
        return drift, config.drift_threshold

    @property
    def descends(self) -> bool:
        """Whether retrieval descends a hierarchy: more chunks than a flat scan takes and than the top
        level holds. A block scanned flat holds its chunks only (the upper levels, 85% of an 8K block's
        build time, would never be read); they are built when it grows past the flat scan."""
        return self.n_chunks > max(self.config.flat_chunks, self.config.top_nodes)

    def _build_upper(self) -> None:
        """(Re)build every level above the chunks."""
        cfg = self.config
        self.levels = self.levels[:1]
        while self.levels[-1].size > cfg.top_nodes:
            below = self.levels[-1]
            nl, h, n, d = below.centroids.shape
            k = max(n_groups(n, cfg.fanout), -(-n // cfg.cap))
            assign = balanced_kmeans(below.centers().reshape(nl * h, n, d), k, cfg.cap)
            children = member_lists(assign, k, None).view(nl, h, k, -1).to(child_dtype(n))
            self.levels.append(_parent_level(below, children, cfg))
        self.grafted = 0

    # ---- lazy update ---------------------------------------------------------------------------
    def update(self, keys: KeyReader, layers: int, resident: torch.Tensor, ends: torch.Tensor) -> bool:
        """Take in tokens the index has not seen (a grown block, or tokens back on the device).

        Chunks holding new tokens are recomputed (a grown block's last chunk is re-cut, as a
        rebuild would cut it); new chunks join their nearest cluster; radii above grow to cover
        them. Returns True when anything changed.
        """
        length = int(ends.numel())
        old = int(self.covered.numel())
        covered = torch.cat([self.covered, torch.zeros(length - old, dtype=torch.bool)])
        fresh = resident[~covered[resident]]
        if not fresh.numel() and length == old:
            return False
        n_old = self.starts.numel() - 1
        starts, touched = self.starts, torch.zeros(0, dtype=torch.long)
        if length > old:  # re-cut from the start of the last chunk, as a rebuild would (prefix-stable)
            tail = int(starts[-2]) if n_old else 0
            drift, thr = self._drift(self.config, keys, layers, resident, ends)
            cut = chunk_starts(ends, self.config.min_len, self.config.max_len, drift, thr, start=tail)
            starts = torch.cat([starts[:-2], cut])
            touched = torch.arange(max(n_old - 1, 0), starts.numel() - 1)
        touched = torch.unique(torch.cat([touched, torch.searchsorted(starts, fresh, right=True) - 1]))
        self.starts, self.covered = starts, covered
        for c in touched.tolist():  # a recomputed chunk covers exactly its resident tokens
            covered[int(starts[c]) : int(starts[c + 1])] = False
        covered[resident[torch.isin(torch.searchsorted(starts, resident, right=True) - 1, touched)]] = True
        self._set_leaves(touched, _leaf_stats(self.config, keys, layers, resident, starts, touched))
        if len(self.levels) == 1 and self.descends:  # grown past the flat scan: the hierarchy now
            self._build_upper()
        elif self.grafted > self.config.rebuild_fraction * self.n_chunks:
            self._build_upper()
        return True

    def _set_leaves(self, ids: torch.Tensor, stats: Level) -> None:
        """Write recomputed / new chunk statistics; graft new chunks; grow radii above them."""
        leaves = self.levels[0]
        n_new = int(ids.max()) + 1 - leaves.size if ids.numel() else 0
        if n_new > 0:
            leaves.grow(n_new)
        leaves.put(ids, stats)
        if len(self.levels) > 1 and n_new > 0:
            self._graft(torch.arange(leaves.size - n_new, leaves.size))
            self.grafted += n_new
        changed = ids
        for depth in range(1, len(self.levels)):
            changed = self._cover(depth, changed)

    def _graft(self, new: torch.Tensor) -> None:
        """New chunks (ids) join the nearest level-1 cluster, per layer and head."""
        parent, leaves = self.levels[1], self.levels[0]
        nl, h, k, m = parent.children.shape
        c = leaves.centers()[:, :, new]  # (L, H, n, D)
        dist = torch.cdist(c, parent.centers())  # (L, H, n, K)
        near = dist.argmin(-1).reshape(nl * h, -1)  # (LH, n)
        kids = parent.children.reshape(nl * h, k, m).long()
        count = (kids >= 0).sum(-1)  # (LH, K)
        joins = member_lists(near, k)  # (LH, K, J): positions in ``new`` joining each cluster
        width = int((count + (joins >= 0).sum(-1)).max())
        kids = torch.cat([kids, torch.full((nl * h, k, max(width - m, 0)), -1, dtype=torch.long)], dim=-1)
        pos = count.unsqueeze(-1) + torch.arange(joins.shape[-1])  # where each joiner goes
        bk = joins >= 0
        rows = torch.arange(nl * h).view(-1, 1, 1).expand_as(joins)
        cols = torch.arange(k).view(1, -1, 1).expand_as(joins)
        kids[rows[bk], cols[bk], pos[bk]] = new[joins[bk]]
        parent.children = kids.view(nl, h, k, -1).to(child_dtype(leaves.size))

    def _cover(self, depth: int, changed: torch.Tensor) -> torch.Tensor:
        """Grow radii of level ``depth`` so each node covers its children; returns the nodes that
        contain a ``changed`` child (the next level's changed set)."""
        lvl, below = self.levels[depth], self.levels[depth - 1]
        kids = lvl.children  # (L, H, N, M)
        hit = torch.isin(kids, changed) & (kids >= 0)
        nodes = torch.nonzero(hit.any(-1).any(0).any(0)).squeeze(1)
        if not nodes.numel():
            return nodes
        sub = kids[:, :, nodes]  # (L, H, n, M)
        cover = round_up(_cover_radius(lvl, below, nodes, sub), lvl.radii.dtype)
        lvl.radii[:, :, nodes] = torch.maximum(lvl.radii[:, :, nodes], cover)
        return nodes

    # ---- retrieval -----------------------------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return self.levels[0].size

    def leaf_bounds(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """(r, H, C) bound of every chunk for queries q (r, H, g, D): max over the g heads of a group."""
        return bound(self.levels[0], layer, q, None, self.config.radius_scale)

    def scores(self, layer: int, q: torch.Tensor) -> torch.Tensor | None:
        """(r, H, C) every chunk's score when the block scans flat (``flat_chunks``), else None."""
        return self.leaf_bounds(layer, q) if self.n_chunks <= self.config.flat_chunks else None

    def retrieve(self, layer: int, q: torch.Tensor, n: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """About the ``n`` chunks with the highest bound, per query row and KV head.

        Args:
            q: (r, H, g, D) float32 queries, the g query heads of each KV head.
            n: chunks wanted.
            exact: return exactly the top-n chunks by bound (a second, threshold pass).
        Returns:
            ids (r, H, m) long chunk ids and their bounds (r, H, m) float32, m = min(n, candidates);
            entries with bound -inf are padding.
        """
        if self.n_chunks <= self.config.flat_chunks:  # one level: the descent would cost more
            scores = bound(self.levels[0], layer, q, None, self.config.radius_scale)
            best, pick = scores.topk(min(n, scores.shape[-1]), dim=-1)
            return pick, best
        ids, scores = self._descend(layer, q, n, None)
        if exact and len(self.levels) > 1:
            found = scores.topk(min(n, scores.shape[-1]), dim=-1).values[..., -1:]  # n-th best leaf so far
            slack = SLACK * found.abs() + 1e-6
            ids, scores = self._descend(layer, q, n, torch.where(torch.isfinite(found), found - slack, found))
        m = min(n, scores.shape[-1])
        best, pick = scores.topk(m, dim=-1)
        return (pick if ids is None else ids.gather(-1, pick)), best

    def _descend(self, layer: int, q: torch.Tensor, n: int, floor: torch.Tensor | None):
        """Level by level from the top: keep the best subtrees (beam) or every subtree whose bound
        reaches ``floor`` (r, H, 1); returns the leaves reached (ids, or None = all) and bounds."""
        ids, scores = None, bound(self.levels[-1], layer, q, None)
        for depth in range(len(self.levels) - 1, 0, -1):
            lvl = self.levels[depth]
            if floor is None:
                keep = min(lvl.size, max(1, -(-int(self.config.oversample * n * lvl.size) // self.n_chunks)))
                top, pos = scores.topk(min(keep, scores.shape[-1]), dim=-1)
                alive = torch.isfinite(top)
            else:
                reach = (scores >= floor) & torch.isfinite(scores)
                width = max(int(reach.sum(-1).max()), 1)
                alive, pos = reach.float().topk(width, dim=-1)
                alive = alive > 0
            nodes = pos if ids is None else ids.gather(-1, pos)  # (r, H, b)
            kids = _children(lvl, layer, nodes)  # (r, H, b * M)
            valid = (kids >= 0) & alive.repeat_interleave(lvl.children.shape[-1], dim=-1)
            ids = kids.clamp(min=0)
            scale = self.config.radius_scale if depth == 1 else 1.0  # the chunks' score; nodes keep the bound
            scores = bound(self.levels[depth - 1], layer, q, ids, scale).masked_fill(~valid, float("-inf"))
        return ids, scores

    @property
    def nbytes(self) -> int:
        """Bytes of the index tensors the accelerator holds (centroids, scales, radii, child lists)."""
        return sum(lvl.nbytes for lvl in self.levels)

    @property
    def host_bytes(self) -> int:
        """Bytes of the host-side bookkeeping (chunk boundaries, coverage mask)."""
        return self.starts.numel() * self.starts.element_size() + self.covered.numel()


# ---- helpers ---------------------------------------------------------------------------------
def bound(level: Level, layer: int, q: torch.Tensor, ids: torch.Tensor | None, scale: float = 1.0) -> torch.Tensor:
    """Upper bound of q . k over each node's keys: max over the g query heads of q.c + |q| r
    (``scale`` < 1: q.c + scale |q| r, an estimate, see ``TreeConfig.radius_scale``; chunks with axes
    add max(q.u hi, q.u lo), see ``TreeConfig.score``).

    Args:
        q: (r, H, g, D) float32; ids: (r, H, m) node ids, or None for every node of the level.
    Returns:
        (r, H, m) float32 (m = the level's size when ids is None).
    """
    rad = level.radii[layer]  # (H, N)
    if ids is None:
        codes, scales = level.centroids[layer], None if level.scales is None else level.scales[layer]
        if not scale and level.axes is None and native.scores_available(codes, scales, q):
            return native.centroid_scores(codes, scales, q)  # the same scores, no float32 table built
        dots = _dots(codes, scales, q)  # (r, H, g, N)
        if scale:  # the centroid score (0, the default) has no radius term, nor a query norm to take
            dots = dots + q.norm(dim=-1, keepdim=True) * scale * rad.float().unsqueeze(1)
        return (dots if level.axes is None else dots + _along_axis(level.axes, layer, q, None)).amax(2)
    norm = q.norm(dim=-1, keepdim=True) * scale  # (r, H, g, 1)
    h, n = rad.shape
    flat = (ids + torch.arange(h).view(1, h, 1) * n).reshape(-1)
    c = level.centers(layer, flat).view(*ids.shape, -1)  # (r, H, m, D)
    r = rad.reshape(-1).index_select(0, flat).view(ids.shape).float()
    dots = torch.matmul(q, c.transpose(-1, -2)) + norm * r.unsqueeze(2)  # (r, H, g, m)
    return (dots if level.axes is None else dots + _along_axis(level.axes, layer, q, ids, flat)).amax(2)


def _along_axis(axes: Axes, layer: int, q: torch.Tensor, ids: torch.Tensor | None, flat=None) -> torch.Tensor:
    """max(q.u hi, q.u lo) of each chunk (``TreeConfig.score='axis'``): (r, H, g, N), or (r, H, g, m)
    for chunk ids (r, H, m) whose flat ``head * N + id`` rows are ``flat``."""
    spans = axes.spans[layer].float()  # (H, N, 2)
    if ids is None:
        qu = _dots(axes.codes[layer], None if axes.scales is None else axes.scales[layer], q)  # (r, H, g, N)
        hi, lo = spans[..., 0].unsqueeze(1), spans[..., 1].unsqueeze(1)  # (H, 1, N)
    else:
        u = axes.units(layer, flat).view(*ids.shape, -1)  # (r, H, m, D)
        qu = torch.matmul(q, u.transpose(-1, -2))  # (r, H, g, m)
        picked = spans.reshape(-1, 2).index_select(0, flat).view(*ids.shape, 2)
        hi, lo = picked[..., 0].unsqueeze(2), picked[..., 1].unsqueeze(2)  # (r, H, 1, m)
    return torch.maximum(qu * hi, qu * lo)


def _dots(codes: torch.Tensor, scales: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """q . (code x scale) of every node of one layer, the scale applied after the matmul (the (N, D)
    dequantized table is never built: a third of the scoring's time at 8K on one CPU thread).

    Args:
        codes: (H, N, D) stored vectors; scales: (H, N) float16 or None; q: (r, H, g, D) float32.
    Returns:
        (r, H, g, N) float32.
    """
    dots = torch.matmul(q, codes.float().transpose(-1, -2))
    return dots if scales is None else dots * scales.float().unsqueeze(1)


def _children(lvl: Level, layer: int, nodes: torch.Tensor) -> torch.Tensor:
    """(r, H, b) node ids -> (r, H, b * M) child ids (-1 padded)."""
    kids = lvl.children[layer]  # (H, N, M)
    h, n, m = kids.shape
    flat = (nodes + torch.arange(h).view(1, h, 1) * n).reshape(-1)
    return kids.reshape(h * n, m).index_select(0, flat).view(*nodes.shape[:2], -1).long()


def _leaf_stats(
    config: TreeConfig, keys: KeyReader, layers: int, resident: torch.Tensor, starts: torch.Tensor, ids: torch.Tensor
) -> Level:
    """Centroid and radius of chunks ``ids`` over their resident tokens, every layer.

    Returns a Level of (L, H, len(ids), D) centroids and (L, H, len(ids)) radii; a chunk with no
    resident token gets a zero centroid and radius.
    """
    chunk_of = torch.searchsorted(starts, resident, right=True) - 1
    slot = torch.full((starts.numel(),), -1, dtype=torch.long)
    slot[ids] = torch.arange(ids.numel())
    local = slot[chunk_of]
    mine = local >= 0
    tokens, local = resident[mine], local[mine]
    per_layer = []
    for layer in range(layers):
        k = keys(layer, tokens).float()  # (H, n, D)
        h, _, d = k.shape
        sums = torch.zeros(h, ids.numel(), d).index_add_(1, local, k)
        count = torch.bincount(local, minlength=ids.numel()).clamp(min=1)
        lvl = Level.store(sums / count.view(1, -1, 1), config)  # (H, C, D): this layer
        dev = k - lvl.centers()[:, local]  # (H, n, D) against the stored centroid
        rad = torch.zeros(h, ids.numel()).scatter_reduce_(1, local.expand(h, -1), dev.norm(dim=-1), "amax")
        lvl.radii = round_up(rad, config.radius_dtype)
        if config.score == "axis":
            lvl.axes = _chunk_axes(dev, local, ids.numel(), config)
        per_layer.append(lvl)
    return Level.stack(per_layer)


def _chunk_axes(dev: torch.Tensor, local: torch.Tensor, n: int, config: TreeConfig) -> Axes:
    """One layer's chunk axes from the deviations ``dev`` (H, t, D) of keys from their stored centroid,
    ``local`` (t,) each key's chunk in 0..n-1: the first principal axis of each chunk's deviations
    (``AXIS_STEPS`` power steps from the farthest key's direction) and the largest / smallest
    projection on the stored axis. A chunk with one key (or keys all at c) gets a zero axis."""
    h = dev.shape[0]
    at = local.expand(h, -1)
    length = dev.norm(dim=-1)  # (H, t)
    far = torch.zeros(h, n).scatter_reduce_(1, at, length, "amax")
    first = length >= far.gather(1, at)  # the farthest key of each chunk (ties: their sum)
    u = torch.zeros(h, n, dev.shape[-1]).index_add_(1, local, dev * first.unsqueeze(-1))
    for _ in range(AXIS_STEPS):
        u = torch.nn.functional.normalize(u, dim=-1)
        proj = (dev * u[:, local]).sum(-1, keepdim=True)
        u = torch.zeros_like(u).index_add_(1, local, dev * proj)
    codes, scales = quantize(torch.nn.functional.normalize(u, dim=-1), config.dtype)
    axes = Axes(codes, scales, torch.zeros(h, n, 2, dtype=config.radius_dtype))
    proj = (dev * dequantize(axes.codes, axes.scales)[:, local]).sum(-1)  # (H, t) on the stored axis
    hi = torch.zeros(h, n).scatter_reduce_(1, at, proj, "amax")
    lo = torch.zeros(h, n).scatter_reduce_(1, at, proj, "amin")
    axes.spans = torch.stack([hi, lo], dim=-1).to(config.radius_dtype)
    return axes


def _parent_level(below: Level, children: torch.Tensor, config: TreeConfig) -> Level:
    """Parents over ``children`` (L, H, K, M): centroid = mean of child centroids, radius covers them."""
    nl, h, k, m = children.shape
    valid = children >= 0
    idx = children.long().clamp(min=0)
    c = below.centers()  # (L, H, N, D)
    d = c.shape[-1]
    gathered = torch.gather(c.unsqueeze(2).expand(nl, h, k, -1, -1), 3, idx.unsqueeze(-1).expand(-1, -1, -1, -1, d))
    w = valid.unsqueeze(-1).float()
    lvl = Level.store((gathered * w).sum(3) / w.sum(3).clamp(min=1), config, children)
    lvl.radii = round_up(_cover_radius(lvl, below, torch.arange(k), children), config.radius_dtype)
    return lvl


def _cover_radius(lvl: Level, below: Level, nodes: torch.Tensor, kids: torch.Tensor) -> torch.Tensor:
    """(L, H, n) radius that covers the children ``kids`` (L, H, n, M) of ``nodes`` (n,):
    max over children of |c_child - C| + r_child, plus float slack."""
    nl, h, n, m = kids.shape
    valid = kids >= 0
    idx = kids.long().clamp(min=0)
    d = below.centroids.shape[-1]
    flat = idx.reshape(nl, h, -1)
    child_c = torch.gather(below.centers(), 2, flat.unsqueeze(-1).expand(-1, -1, -1, d)).view(nl, h, n, m, d)
    child_r = torch.gather(below.radii.float(), 2, flat).view(nl, h, n, m)
    center = lvl.centers()[:, :, nodes].unsqueeze(3)  # (L, H, n, 1, D)
    reach = ((child_c - center).norm(dim=-1) + child_r).masked_fill(~valid, 0.0)
    r = reach.amax(-1)
    return r * (1 + SLACK) + 1e-6


def dequantize(codes: torch.Tensor, scales: torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Stored vectors to float32: ``codes`` (..., N, D) times ``scales`` (..., N) (None: float codes), or with
    ``rows`` the flat ids ``head * N + node`` of one layer's (H, N, D) codes, giving (len(rows), D). Exact
    for int8 codes and float16 scales (8 x 11 bits < 24). The flat scan's :func:`_dots` scales after the
    matmul instead, never building the table."""
    if rows is not None:
        codes = codes.reshape(-1, codes.shape[-1]).index_select(0, rows)
        scales = None if scales is None else scales.reshape(-1).index_select(0, rows)
    out = codes.float()
    return out if scales is None else out * scales.float().unsqueeze(-1)


def quantize(centers: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 centroids (..., D) -> (stored centroids, per-node scales or None): the one place
    that quantizes. int8: symmetric codes ``round(c / s)`` with ``s = max|c| / 127`` rounded up to
    float16 first, so the codes are fitted to the scale ``code * s`` (:meth:`Level.centers`) reads
    back with and stay within -127..127 (the clamp only acts past float16's range, where the radius
    measured against the dequantized centroid absorbs it). float16 / float32: a cast, no scales."""
    if dtype != torch.int8:
        return centers.to(dtype), None
    scales = round_up((centers.abs().amax(-1) / QMAX).clamp(max=torch.finfo(torch.float16).max), torch.float16)
    step = scales.float().unsqueeze(-1)
    codes = torch.where(step > 0, centers / step.clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    return codes.round().clamp(-QMAX, QMAX).to(torch.int8), scales


def round_up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``x`` in ``dtype``, rounded toward +inf (never below ``x``: a radius stays a bound)."""
    out = x.to(dtype)
    if dtype == x.dtype:
        return out
    low = out.float() < x
    return torch.where(low, torch.nextafter(out, torch.full_like(out, float("inf"))), out)


def child_dtype(n: int) -> torch.dtype:
    """Storage of child ids into a level of ``n`` nodes: int16 while they fit (-1 pads), else int32."""
    return torch.int16 if n <= torch.iinfo(torch.int16).max else torch.int32


def _grow(t: torch.Tensor, n: int, value: float) -> torch.Tensor:
    """``t`` with n more entries along dim 2, filled with ``value``."""
    pad = torch.full((*t.shape[:2], n, *t.shape[3:]), value, dtype=t.dtype)
    return torch.cat([t, pad], dim=2)
