"""Dense tree attention: every row attends the blocks on its path where they lie, merged by log-sum-exp.

A batch's rows are root-to-leaf paths that share blocks. For each layer, the attention hook
(hook.py) hands :meth:`TreeBatch.attend` the layer's query and new tokens; it attends each block
segment once for all rows whose path contains it (their queries gathered, the keys read in place
from the device pool, or as packed copies of at most ``PACK_MAX_TOKENS`` when evictions left a
block's kept tokens in many short runs), attends each row's own new tokens, and merges the partial
results exactly (merge.py):

    s = logsumexp_i s_i,    o = sum_i exp(s_i - s) o_i          (DeFT, Hydragen, FlashInfer cascade)

Nothing that grows with the context is ever materialized: scratch is the gathered queries and
partial outputs (rows x new tokens), one packed copy at a time (at most ``PACK_MAX_TOKENS``), and,
when statistics are on, score tiles of at most rows x new tokens x ``KEY_CHUNK`` keys
(``arbor_runtime/scratch.py`` states the bound). Attention statistics (the softmax mass each key
receives, summed over heads and queries) come from the same partials: a second pass per segment with
the final log-sum-exp, which reads each segment again (a packed one is copied again) rather than
keeping every segment's copy alive until then. The masses go into one float per context slot read,
allocated with the batch.

What a layer asks through the attention interface (:class:`~arbor_runtime.attention.call.AttentionCall`)
is served exactly: its scale; a soft cap on every partial's scores (the log-sum-exp of capped scores
merges like any other); a sliding window as a mask on the keys' original positions (pieces outside
every query's window are not read, pieces inside it are read unmasked, window.py); learned sinks as
one more partial with log-sum-exp ``sink`` and output 0, merged last.

The batch is also the model's cache: transformers calls :meth:`TreeBatch.update` once per layer,
which writes the new tokens' K/V straight into their pool slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from arbor_runtime.attention.call import AttentionCall
from arbor_runtime.attention.kernels import KEY_CHUNK, Kernel, attention_mass, capped_scores
from arbor_runtime.attention.merge import RowPartials, merge_partials
from arbor_runtime.attention.window import Visibility, decode_own_mask, own_window_mask, visibility
from arbor_runtime.batch import Group, Piece
from arbor_runtime.kv.pool import DevicePool, Extent
from arbor_runtime.kv.store import KVStore

if TYPE_CHECKING:
    from arbor_runtime.sparse.step import SparseStep


class TreeBatch:
    """Plan of one forward: who attends what, where new K/V go, what statistics to collect.

    Args:
        pool: the device pool holding every context token.
        groups: context blocks with their rows and segments.
        rows / q: batch rows and new tokens per row.
        write_slots: (R, q) long pool slot for each new token's K/V, -1 to not store it.
        own_slots / own_valid: (R, n) long / bool, decode only: each row's generated tokens so far
            *including* this step's token (written before attention reads it). None for a prefill,
            where the new tokens attend each other causally from the layer's own K/V.
        stats: collect attention mass per context token (``Group.mass``) and per own token (``own_mass``).
        head_stats: with ``stats``, keep the masses per layer and KV head too (per-head retention,
            ``policy.granularity=head``): ``Group.mass`` pieces are then (L, H_kv, n) and
            ``own_head_mass`` (R, L, H_kv, n); ``own_mass`` stays their sum.
        kernel: the (out, lse) attention kernel.
        stats_from: only the queries of each row from this index on count in the statistics (an
            observation window: the last ``q - stats_from`` tokens of a prefill); 0 = all of them.
        reads: :func:`group_reads` of ``groups`` when the caller kept them from an earlier batch over the
            same layout (decode steps); None: worked out here.
    """

    def __init__(
        self,
        pool: DevicePool,
        groups: list[Group],
        rows: int,
        q: int,
        write_slots: torch.Tensor,
        own_slots: torch.Tensor | None = None,
        own_valid: torch.Tensor | None = None,
        stats: bool = False,
        kernel: Kernel | None = None,
        stats_from: int = 0,
        reads: list[list[Read]] | None = None,
        head_stats: bool = False,
    ) -> None:
        if not 0 <= stats_from < q or (stats_from and own_slots is not None):
            raise ValueError(f"stats_from={stats_from} must be in [0, q={q}), and 0 for a decode step")
        self.pool, self.groups, self.rows, self.q, self.stats_from = pool, groups, rows, q, stats_from
        self.kernel = kernel or Kernel(pool.device)
        flat = write_slots.reshape(-1)
        keep = flat >= 0
        device = pool.device
        self._write_sel = None if bool(keep.all()) else torch.nonzero(keep).squeeze(1).to(device)
        self._write_slots = flat[keep].to(device)
        for g in groups:  # index_select / index_copy on an accelerator need the index there too
            if g.rows is not None and g.rows.device != device:  # (a decode layout's groups stay there)
                g.rows = g.rows.to(device)
        self.own_slots = None if own_slots is None else own_slots.to(device)
        self.own_valid = None if own_valid is None else own_valid.to(device)
        #: a decode step whose rows all read every own slot and whose statistics are off: the own tokens
        #: go through the attention kernel like any context read
        self._own_plain = own_valid is not None and not stats and bool(own_valid.all())
        #: per group: how its pieces are read (:class:`Read`): each in place, or short pieces in packed
        #: copies (one kernel call and one merge instead of one per piece)
        self._reads = reads if reads is not None else group_reads(groups, device)
        self.stats = stats
        self.head_stats = stats and head_stats
        self.own_mass: torch.Tensor | None = None
        #: (R, L, H_kv, n) the own tokens' masses per layer and KV head (``head_stats`` only)
        self.own_head_mass: torch.Tensor | None = None
        #: (R, q) long original positions of the new tokens, on the host: set by the backend before the
        #: forward (a sliding window needs them)
        self.positions: torch.Tensor | None = None
        #: window -> per group, the visibility of each of its reads (:class:`Read`)
        self._visible: dict[int, list[list[Visibility]]] = {}
        self._own_masks: dict[int, torch.Tensor] = {}  # window -> a prefill's mask over its new tokens
        #: a decode step's sparse layout (arbor_runtime/sparse); None = dense attention
        self.sparse: SparseStep | None = None
        #: decode steps: each row's context block ids in path order (blocks with no device token too)
        self.context_ids: list[list[int]] | None = None
        #: statistics in the same pass as the attention (a decode step whose rows read few enough context
        #: tokens that their scores fit the one score tile the scratch bound allows: rows x KEY_CHUNK):
        #: each read's scores are kept until the log-sum-exp is final, no key is read twice
        self.fused_stats = stats and not self.head_stats and own_slots is not None and fused_fits(groups, rows)
        #: per group: one (n,) mass tensor, (L, H_kv, n) with ``head_stats``, whose views are its pieces'
        #: ``Group.mass`` (a read adds to a slice)
        self._flat_mass: list[torch.Tensor | None] = [None] * len(groups)
        lead = (pool.shape.layers, pool.shape.kv_heads) if self.head_stats else ()
        if stats:
            for i, g in enumerate(groups):
                n = sum(p.length for p in g.pieces)
                self._flat_mass[i] = torch.zeros(*lead, n, dtype=torch.float32, device=device)
                g.mass = list(torch.split(self._flat_mass[i], [p.length for p in g.pieces], dim=-1))

    # ---- Cache duck type: transformers calls this once per layer -------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the new tokens' (R, H_kv, q, D) K/V into their slots; hand them back unchanged."""
        if self._write_slots.numel():
            flat = [s.transpose(0, 1).reshape(s.shape[1], -1, s.shape[3]) for s in (key_states, value_states)]
            if self._write_sel is not None:  # (H_kv, R*q, D) -> the tokens that are stored
                flat = [f.index_select(1, self._write_sel) for f in flat]
            self.pool.write_layer(layer_idx, self._write_slots, *flat)
        return key_states, value_states

    # ---- attention ------------------------------------------------------------------------------
    def attend(self, layer: int, query, key, value, call: AttentionCall) -> torch.Tensor:
        """query (R, Hq, q, D); key/value (R, H_kv, q, D). Returns (R, q, Hq, D) in the query dtype."""
        if self.sparse is not None:
            if not self.sparse.reads_whole(layer):
                return self._attend_sparse(layer, query, key, value, call)
            self.sparse.count_whole()
        r, hq, q, d = query.shape
        hkv = key.shape[1]
        g = hq // hkv
        qg = query.reshape(r, hkv, g * q, d)  # query head h = kv * g + j: grouped, keys never repeated
        own = self._attend_own(layer, qg, query, key, value, call)
        partials = RowPartials(own[0], own[1], MERGE_BUFFER_ROWS * r)
        scored: list[tuple[torch.Tensor, int, int, torch.Tensor]] = []  # a fused statistics pass's scores
        for i, grp in enumerate(self.groups):
            qf = _gather_queries(qg, grp.rows)  # (1, H_kv, rows * g * q, D)
            for read, mask in self._seen(i, call.window, g):  # one read's keys alive at a time
                k, v = self._read_kv(layer, grp, read)
                o, s = self.kernel(qf, k, v, call.scale, softcap=call.softcap, mask=mask)
                partials.add(grp.rows, *_by_row(o, s, grp.n_rows))
                if self.fused_stats:  # the scores while the keys are read; their mass once lse is final
                    scores = _masked(capped_scores(qf, k, call.scale, call.softcap), mask)
                    scored.append((self._flat_mass[i], read.offset, i, scores))
                del k, v, o, s
        out, lse = partials.result()
        if call.sinks is not None:
            out, lse = _merge_sinks(out, lse, call.sinks, q)
        if self.fused_stats:
            self._collect_scored(scored, lse)
            self._collect_own(own[2], lse, call, layer)
        elif self.stats:
            self._collect(layer, qg, own, lse, call, g)
        return out.to(query.dtype).view(r, hq, q, d).transpose(1, 2)

    def _attend_sparse(self, layer: int, query, key, value, call: AttentionCall) -> torch.Tensor:
        """Decode attention over the context chunks ``self.sparse`` picks, plus the own tokens."""
        if not call.plain:  # Runtime refuses sparse policies for such models before any work
            raise RuntimeError("sparse decode attention serves plain softmax attention only")
        scale = call.scale
        r, hq, q, d = query.shape
        hkv = key.shape[1]
        qg = query.reshape(r, hkv, (hq // hkv) * q, d)
        if not self.stats and self.sparse.owner.fast:  # own tokens in the same gather and softmax
            out = self.sparse.attend_all(layer, qg, self.own_slots, self.own_valid, scale)
            return out.to(query.dtype).view(r, hq, q, d).transpose(1, 2)
        own_out, own_lse, own_scores = self._attend_own(layer, qg, query, key, value, call)
        out, lse = self.sparse.attend(layer, qg, own_out, own_lse, scale)
        if self.stats:  # the own tokens' mass under the final log-sum-exp
            mass = torch.exp(own_scores - lse.unsqueeze(-1)).sum(dim=(1, 2))  # (R, n)
            self.own_mass = mass if self.own_mass is None else self.own_mass + mass
        return out.to(query.dtype).view(r, hq, q, d).transpose(1, 2)

    def _attend_own(self, layer, qg, query, key, value, call: AttentionCall):
        """Each row's own tokens: its generated tokens from the pool (decode) or causal new tokens.

        Returns (out, lse, extra): (R, H_kv, g*q, D), (R, H_kv, g*q) float32, and what the
        statistics pass needs: the own scores (decode; None when a plain step ran them through the kernel)
        or the (query, repeated keys, mask) of a prefill (mask: (R, 1, q, q) bool under a window, else
        None = causal).
        """
        if self.own_slots is None:
            g = query.shape[1] // key.shape[1]
            k, v = key.repeat_interleave(g, dim=1), value.repeat_interleave(g, dim=1)  # rows x new tokens only
            mask = None if call.window is None else self._own_mask(call.window)
            o, s = self.kernel(query, k, v, call.scale, causal=mask is None, softcap=call.softcap, mask=mask)
            r, hkv, gq, d = qg.shape  # o (R, Hq, q, D), s (R, Hq, q)
            return o.reshape(r, hkv, gq, d).float(), s.reshape(r, hkv, gq).float(), (query, k, mask)
        k, v = _rows_gather(self.pool, layer, self.own_slots)  # (R, H_kv, n, D) each
        if self._own_plain and call.softcap is None and call.window is None:  # every slot seen, nothing scored
            o, s = self.kernel(qg, k, v, call.scale)
            return o.float(), s.float(), None
        scores = capped_scores(qg, k, call.scale, call.softcap)  # (R, H_kv, g*q, n)
        seen = decode_own_mask(self.own_valid, call.window)
        scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.matmul(torch.softmax(scores, dim=-1), v.float())
        return out, lse, scores

    def _seen(self, i: int, window: int | None, g: int) -> list[tuple[Read, torch.Tensor | None]]:
        """The reads of group ``i`` a layer with ``window`` attends, each with its mask: None (every key
        seen), else (M, n) bool where the window's edge cuts through the read; reads outside every
        query's window are left out."""
        reads = self._reads[i]
        if window is None:
            return [(read, None) for read in reads]
        vis = self._visibility(i, window, g)
        pairs = zip(reads, vis, strict=True)
        return [(read, None if seen is True else seen) for read, seen in pairs if seen is not False]

    def _visibility(self, i: int, window: int, g: int) -> list[Visibility]:
        """Per read of group ``i``: how its gathered queries see its keys (masks on the pool's device),
        worked out once per window for every layer that has it."""
        per_window = self._visible.setdefault(window, [None] * len(self.groups))
        if per_window[i] is None:
            grp = self.groups[i]
            pos = self._positions()
            qpos = pos if grp.rows is None else pos.index_select(0, grp.rows.cpu())
            qpos = qpos.unsqueeze(1).expand(-1, g, -1).reshape(-1)  # the order of _gather_queries
            keys = [torch.cat([grp.start_pos + p.idx for p in grp.pieces[r.lo : r.hi]]) for r in self._reads[i]]
            seen = [visibility(qpos, kpos, window) for kpos in keys]
            per_window[i] = [v if isinstance(v, bool) else v.to(self.pool.device) for v in seen]
        return per_window[i]

    def _own_mask(self, window: int) -> torch.Tensor:
        """(R, 1, q, q) bool: a prefill's new tokens over themselves, causal and within ``window`` (once per window)."""
        if window not in self._own_masks:
            self._own_masks[window] = own_window_mask(self._positions(), window).to(self.pool.device)
        return self._own_masks[window]

    def _positions(self) -> torch.Tensor:
        if self.positions is None:
            raise RuntimeError("a sliding-window layer needs the batch's positions (set by the backend)")
        return self.positions

    def _read_kv(self, layer: int, grp: Group, read: Read) -> tuple[torch.Tensor, torch.Tensor]:
        """One read's keys and values, (1, H_kv, n, D) each: a strided view into the pool (one piece,
        no copy) or one packed copy of its short pieces (``read.slots``, at most ``PACK_MAX_TOKENS``)."""
        if read.slots is None:
            piece = grp.pieces[read.lo]
            k, v = self.pool.layer_view(layer, Extent(piece.start, piece.length))
        else:
            k, v = self.pool.gather_runs(layer, read.slots, read.runs)
        return k.unsqueeze(0), v.unsqueeze(0)

    def _collect(self, layer: int, qg, own, lse, call: AttentionCall, g: int) -> None:
        """Attention mass per key under the final log-sum-exp of each counted query, read by read
        (the keys read again, the queries gathered again: nothing of the first pass is kept)."""
        extra, scale, cap = own[2], call.scale, call.softcap
        if self.stats_from:  # the observation window: queries stats_from.. of each row (prefill only)
            qg, lse = _window(qg, self.q, self.stats_from), _window(lse, self.q, self.stats_from)
            query, k, mask = extra
            extra = (query[:, :, self.stats_from :], k, None if mask is None else mask[:, :, self.stats_from :])
        for i, (grp, flat) in enumerate(zip(self.groups, self._flat_mass, strict=True)):
            qf = _gather_queries(qg, grp.rows)
            s = lse if grp.rows is None else lse.index_select(0, grp.rows)
            s = s.transpose(0, 1).reshape(1, s.shape[1], -1)  # (1, H_kv, rows * g * q), query order of qf
            for read, mask in self._seen(i, call.window, g):
                if self.stats_from and mask is not None:  # the window's rows of the counted queries
                    mask = _window(mask[None, None], self.q, self.stats_from)[0, 0]
                k, _ = self._read_kv(layer, grp, read)
                span = slice(read.offset, read.offset + read.length)
                target = flat[layer, :, span] if self.head_stats else flat[span]  # (H_kv, n) or (n,)
                attention_mass(qf, k, s, scale, softcap=cap, mask=mask, out=target)
                del k
        self._collect_own(extra, lse, call, layer)

    def _collect_scored(self, scored: list[tuple[torch.Tensor, int, int, torch.Tensor]], lse: torch.Tensor) -> None:
        """The fused pass's masses (decode): each read's kept (1, H_kv, rows * g * q, n) scores under the
        final log-sum-exp of its rows' queries, added to its slice of the group's masses."""
        for flat, offset, i, scores in scored:
            rows = self.groups[i].rows
            s = lse if rows is None else lse.index_select(0, rows)
            s = s.transpose(0, 1).reshape(1, s.shape[1], -1, 1)  # the query order of _gather_queries
            flat[offset : offset + scores.shape[-1]] += scores.sub_(s).exp_().sum(dim=(0, 1, 2))

    def _collect_own(self, extra, lse: torch.Tensor, call: AttentionCall, layer: int) -> None:
        """The own tokens' masses under the final log-sum-exp: a decode row's generated tokens (``extra``
        its (R, H_kv, g*q, n) scores), or a prefill's new tokens, causal, row by row (``extra`` the
        counted queries, the repeated keys and the window mask)."""
        scale, cap = call.scale, call.softcap
        if self.head_stats:
            heads = self._own_head_mass(extra, lse, call)  # (R, H_kv, n)
            if self.own_head_mass is None:
                r, hkv, n = heads.shape
                self.own_head_mass = torch.zeros(
                    r, self.pool.shape.layers, hkv, n, dtype=torch.float32, device=heads.device
                )
            self.own_head_mass[:, layer] += heads  # on the device: read once, after the forward
            mass = heads.sum(dim=1)
        elif isinstance(extra, torch.Tensor):  # decode: (R, H_kv, g*q, n) scores of the own tokens
            mass = torch.exp(extra - lse.unsqueeze(-1)).sum(dim=(1, 2))  # (R, n)
        else:  # prefill: causal mass over the new tokens, row by row
            query, k, mask = extra
            final = lse.reshape(query.shape[0], query.shape[1], query.shape[2])  # (R, Hq, counted queries)
            mass = torch.stack(
                [
                    attention_mass(
                        query[i : i + 1],
                        k[i : i + 1],
                        final[i : i + 1],
                        scale,
                        causal=mask is None,
                        softcap=cap,
                        mask=None if mask is None else mask[i, 0],
                    )
                    for i in range(query.shape[0])
                ]
            )
        self.own_mass = mass if self.own_mass is None else self.own_mass + mass

    def _own_head_mass(self, extra, lse: torch.Tensor, call: AttentionCall) -> torch.Tensor:
        """(R, H_kv, n) the own tokens' masses per KV head (query heads of a group summed)."""
        if isinstance(extra, torch.Tensor):  # decode: (R, H_kv, g*q, n) scores
            return torch.exp(extra - lse.unsqueeze(-1)).sum(dim=2)
        query, k, mask = extra  # prefill: (R, Hq, M, D) counted queries, (R, Hq, n, D) repeated keys
        r, hq, m = query.shape[:3]
        hkv = self.pool.shape.kv_heads
        final = lse.reshape(r, hq, m)
        out = torch.zeros(r, hq, k.shape[2], dtype=torch.float32, device=query.device)
        for i in range(r):
            attention_mass(
                query[i : i + 1],
                k[i : i + 1],
                final[i : i + 1],
                call.scale,
                causal=mask is None,
                softcap=call.softcap,
                mask=None if mask is None else mask[i, 0],
                out=out[i],
            )
        return out.reshape(r, hkv, hq // hkv, -1).sum(dim=2)


#: row entries of context partials buffered before they are merged into the rows (x the batch's rows):
#: one scatter merge per buffer instead of one merge per block read
MERGE_BUFFER_ROWS = 2

#: a block's pieces are read as packed copies when it has several and they average fewer tokens
#: than this: each piece read in place costs a kernel call and a merge per layer (after evictions a
#: block's kept tokens lie in dozens of short runs), a copy costs its bytes
PACK_BELOW_TOKENS = 512
#: tokens one packed copy holds at most (a block's short pieces beyond it go to further copies, and a
#: piece of PACK_BELOW_TOKENS or more is read in place): the copy alive at any time is bounded by this,
#: never by the block's length
PACK_MAX_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class Read:
    """Pieces ``lo:hi`` of a group, read together: in place (one piece, ``slots`` None) or as one
    packed copy of the pool ``slots`` (N,) lying in the slot ``runs``. ``offset`` / ``length``: the
    span of the group's tokens (pieces in order) it covers, where its attention mass goes."""

    lo: int
    hi: int
    offset: int
    length: int
    slots: torch.Tensor | None = None
    runs: tuple[tuple[int, int], ...] = ()

    @property
    def packed(self) -> bool:
        return self.slots is not None


def group_reads(groups: Sequence[Group], device: torch.device) -> list[list[Read]]:
    """Per group, how its pieces are read (:func:`_reads`)."""
    return [_reads(g.pieces, device) for g in groups]


def _reads(pieces: Sequence[Piece], device: torch.device) -> list[Read]:
    """How a group's pieces are read: each in place, or, when there are several averaging fewer than
    PACK_BELOW_TOKENS, runs of short pieces in packed copies of at most PACK_MAX_TOKENS each."""
    offsets = [0]
    for p in pieces:
        offsets.append(offsets[-1] + p.length)
    if len(pieces) < 2 or offsets[-1] >= PACK_BELOW_TOKENS * len(pieces):
        return [Read(i, i + 1, offsets[i], p.length) for i, p in enumerate(pieces)]
    reads, lo = [], 0
    for i, p in enumerate([*pieces, None]):
        long = p is not None and p.length >= PACK_BELOW_TOKENS
        full = p is not None and offsets[i + 1] - offsets[lo] > PACK_MAX_TOKENS
        if p is None or long or full:
            if lo < i:
                reads.append(_pack(pieces, lo, i, offsets, device))
            lo = i
        if long:
            reads.append(Read(i, i + 1, offsets[i], p.length))
            lo = i + 1
    return reads


def _pack(pieces: Sequence[Piece], lo: int, hi: int, offsets: list[int], device: torch.device) -> Read:
    """One packed read of pieces ``lo:hi`` (a lone piece is read in place)."""
    if hi - lo == 1:
        return Read(lo, hi, offsets[lo], pieces[lo].length)
    runs = tuple((p.start, p.start + p.length) for p in pieces[lo:hi])
    slots = torch.cat([torch.arange(a, b) for a, b in runs]).to(device)
    return Read(lo, hi, offsets[lo], offsets[hi] - offsets[lo], slots, runs)


def fused_fits(groups: Sequence[Group], rows: int) -> bool:
    """Do a decode step's context scores, kept for every read until the log-sum-exp is final, fit the
    statistics' one score tile (rows x KEY_CHUNK keys per query head): sum of rows x tokens per group."""
    return sum(g.n_rows * sum(p.length for p in g.pieces) for g in groups) <= rows * KEY_CHUNK


def _masked(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(1, H_kv, M, n) scores with the keys a query does not see (``mask`` (M, n) False) at -inf."""
    return scores if mask is None else scores.masked_fill_(~mask, float("-inf"))


def _gather_queries(qg: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """(R, H_kv, G, D) -> (1, H_kv, r * G, D) for the given rows (all when None)."""
    sub = qg if rows is None else qg.index_select(0, rows)
    return sub.transpose(0, 1).reshape(1, qg.shape[1], -1, qg.shape[3])


def _window(t: torch.Tensor, q: int, start: int) -> torch.Tensor:
    """(R, H_kv, g*q, ...) per-query tensor -> (R, H_kv, g*(q-start), ...) of queries start.. of each row."""
    r, hkv = t.shape[0], t.shape[1]
    return t.view(r, hkv, -1, q, *t.shape[3:])[:, :, :, start:].reshape(r, hkv, -1, *t.shape[3:])


def _merge_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, q: int):
    """Merge learned sinks: (R, H_kv, g*q, D) / (R, H_kv, g*q) with a partial of output 0 and log-sum-exp
    ``sinks[h]`` per query head h (Hq,) (gpt-oss: ``softmax([scores, sink])`` with the sink dropped)."""
    r, hkv, gq, _ = out.shape
    sink = sinks.detach().float().to(lse.device).view(hkv, gq // q, 1).expand(hkv, gq // q, q).reshape(1, hkv, gq)
    return merge_partials(out, lse, torch.zeros_like(out), sink.expand(r, hkv, gq))


def _by_row(o: torch.Tensor, s: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A read's partial (1, H_kv, rows * G, D) / (1, H_kv, rows * G), queries in the order of
    :func:`_gather_queries`, as views (rows, H_kv, G, D) / (rows, H_kv, G)."""
    hkv, d = o.shape[1], o.shape[3]
    return o.view(hkv, n_rows, -1, d).transpose(0, 1), s.view(hkv, n_rows, -1).transpose(0, 1)


def _rows_gather(pool: DevicePool, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V at (R, n) slots -> (R, H_kv, n, D) each (a copy: rows x new tokens)."""
    r, n = slots.shape
    k, v = pool.gather_layer(layer, slots.reshape(-1))  # (H_kv, R*n, D)
    return k.view(-1, r, n, k.shape[-1]).transpose(0, 1), v.view(-1, r, n, v.shape[-1]).transpose(0, 1)


def context_groups(store: KVStore, contexts: Sequence[Sequence[int]]) -> list[Group]:
    """Group the blocks of each row's context (block ids in path order) by block.

    Blocks with no token on the device are skipped. Rows of a block shared by every row get
    ``rows=None`` (their queries are used without gathering).
    """
    holders: dict[int, list[int]] = {}
    for row, ids in enumerate(contexts):
        for block_id in ids:
            holders.setdefault(block_id, []).append(row)
    groups = []
    for block_id, rows in sorted(holders.items()):
        blk = store.get(block_id)
        pieces = [Piece(block_id, s.start, s.idx) for s in blk.segments if s.length]
        if not pieces:
            continue
        every = len(rows) == len(contexts)
        rows_t = None if every else torch.tensor(rows)
        groups.append(Group(block_id, rows_t, len(rows), pieces, start_pos=blk.start_pos))
    return groups
