"""One sparse decode step: its layout over the context blocks, and at every layer the selection and
the attention.

:meth:`~arbor_runtime.sparse.attend.SparseAttention.prepare` lays out the step once (every context
block's chunks and the pool slots of their resident tokens, which chunks each row must read);
then at every layer :meth:`SparseStep.attend`:

1. retrieval: each indexed block ranks its chunks for the rows that hold it, per KV head
   (batched over rows and heads); with the forced chunks (sinks, window, blocks read whole)
   they are sorted and taken until ``token_budget`` resident tokens per row and head;
2. attention: the chosen chunks' K/V are gathered from the pool (rows x heads x budget: bounded
   scratch, never rows x context), attended with the row's own tokens, and merged by
   log-sum-exp exactly as the dense path merges its pieces.

With ``rerank`` (``SelectConfig.rerank``) step 1 takes ``rerank x token_budget`` tokens of chunks, the
candidates; their resident tokens are packed (no padding), their keys alone gathered and scored (the
attention's own scaled q.k), the forced keys and the best others up to ``token_budget`` kept (max over
the KV head's query heads, as the oracle ranks: an oracle key among the candidates is kept, but at the
budget's edge when the forced chunks hold more keys than the forced tokens), and only the kept keys'
values gathered.

Retrieval is over what is resident: chunks whose tokens a memory policy evicted are skipped, a
partly evicted chunk is read for the tokens it still has (its bound still holds for them). On
demand each layer also counts the rehydration demand (demand.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from arbor_runtime.attention.merge import merge_partials
from arbor_runtime.batch import BatchView, Group
from arbor_runtime.sparse import native
from arbor_runtime.sparse.demand import count_demand
from arbor_runtime.sparse.index import BlockIndex, BlockIndexes, GroupPlan, IndexEntry


@dataclass(slots=True)
class SparseStep:
    """One decode step's layout (made by :meth:`~arbor_runtime.sparse.attend.SparseAttention.prepare`)
    and its per-layer attention.

    Chunks of every context block get step-wide ids. Tables: ``slots`` (C, W) pool slots of each
    chunk's resident tokens (-1 padded), ``length`` (C,) resident tokens, ``target`` (C, W) the
    token's place in the concatenation of every group's pieces (for attention statistics),
    ``forced`` (R, C) bool chunks a row always reads, ``visible`` (R, C) bool.
    """

    owner: BlockIndexes
    batch: BatchView
    plans: list[GroupPlan] = field(default_factory=list)
    parts: list[tuple] = field(default_factory=list)
    n_chunks: int = 0
    n_tokens: int = 0
    piece_offsets: list[list[int]] = field(default_factory=list)
    slots: torch.Tensor | None = None
    length: torch.Tensor | None = None
    target: torch.Tensor | None = None
    forced: torch.Tensor | None = None
    forced_ids: torch.Tensor | None = None
    context: torch.Tensor | None = None
    hosted_ids: list[torch.Tensor] = field(default_factory=list)
    hosted: torch.Tensor | None = None  # (C,) bool: chunk has host-tier tokens its index covers (on demand)
    demand: torch.Tensor | None = None  # (C,) float: selections each hosted chunk would have entered
    whole_blocks: list[int] = field(default_factory=list)  # context blocks read whole (not indexed)
    context_total: int = 0
    base: torch.Tensor | None = None  # (R, 1, C) float: +inf forced, -inf unreadable, else 0 (None: on demand)
    smallest: torch.Tensor | None = None  # (C,) cumulative sums of the chunks' lengths, smallest first
    must: torch.Tensor | None = None  # (R, H, K) bool: the last selection's chunks scored +inf (read whatever the cut)

    def add_group(self, grp: Group, entry: IndexEntry, start_pos: int) -> None:
        """Lay out one context block's chunks (cached per block while its segments stay)."""
        width = self.owner.select.width
        key = tuple((p.start, p.length) for p in grp.pieces) + (entry.length, id(entry.index))
        if entry.layout_key != key or entry.layout is None:
            entry.layout = _layout(grp, entry.index, width)
            entry.layout_key = key
        slots, target, lo, hi = entry.layout
        offsets, off = [], self.n_tokens
        for p in grp.pieces:
            offsets.append(off)
            off += p.length
        self.piece_offsets.append(offsets)
        whole = entry.index is None
        if whole:
            self.whole_blocks.append(grp.block_id)
        elif self.owner.on_demand:
            self._note_hosted(grp.block_id, entry.index)
        self.parts.append((grp.rows, slots, target + self.n_tokens, lo + start_pos, hi + start_pos, whole))
        if not whole:
            sel = self.owner.select
            mean = max(entry.length / max(entry.index.n_chunks, 1), 1.0)
            n = min(entry.index.n_chunks, math.ceil(sel.candidate_tokens / mean) + 1)
            self.plans.append(GroupPlan(entry.index, grp.rows, self.n_chunks, n, grp.block_id))
        self.n_chunks += int(slots.shape[0])
        self.n_tokens = off

    def add_away(self, block_id: int, rows: torch.Tensor | None, entry: IndexEntry) -> None:
        """A context block with no token on the device: its chunks join the step unread (length 0),
        so retrieval ranks them for rehydration; a block too short to index is wanted whole."""
        if entry.index is None:
            self.whole_blocks.append(block_id)
            return
        self._note_hosted(block_id, entry.index)
        c, w = entry.index.n_chunks, self.owner.select.width
        empty = torch.full((c, w), -1, dtype=torch.long)
        lo, hi = torch.full((c,), 1 << 40), torch.full((c,), -(1 << 40))  # never a sink nor in the window
        self.parts.append((rows, empty, empty, lo, hi, False))
        mean = max(entry.length / max(c, 1), 1.0)
        n = min(c, math.ceil(self.owner.select.candidate_tokens / mean) + 1)
        self.plans.append(GroupPlan(entry.index, rows, self.n_chunks, n, block_id))
        self.n_chunks += c

    def _note_hosted(self, block_id: int, index: BlockIndex) -> None:
        """Step chunk ids of the block's chunks that have host-tier tokens the index covers."""
        idx = self.owner.store.host.indices(block_id)
        if idx is None:
            return
        idx = idx[index.covered[idx]] if int(index.covered.numel()) else idx[:0]
        chunk = torch.searchsorted(index.starts, idx, right=True) - 1
        self.hosted_ids.append(torch.unique(chunk) + self.n_chunks)

    def finish(self, positions: torch.Tensor) -> None:
        """Step-wide tables and, per row, the chunks it must read (sinks, window, blocks read whole)."""
        sel, r = self.owner.select, self.batch.rows
        empty = torch.zeros(0, sel.width, dtype=torch.long)
        self.slots = torch.cat([p[1] for p in self.parts]) if self.parts else empty
        self.target = torch.cat([p[2] for p in self.parts]) if self.parts else empty
        self.length = (self.slots >= 0).sum(-1)
        visible = torch.zeros(r, self.n_chunks, dtype=torch.bool)
        forced = torch.zeros(r, self.n_chunks, dtype=torch.bool)
        pos = positions.view(-1, 1).cpu()
        c = 0
        for rows, slots, _, lo, hi, whole in self.parts:
            n = int(slots.shape[0])
            seen = torch.ones(r, dtype=torch.bool)
            if rows is not None:
                seen = torch.zeros(r, dtype=torch.bool).index_fill_(0, rows.cpu(), True)
            visible[:, c : c + n] = seen.view(-1, 1)
            must = (lo < sel.sink_tokens).view(1, -1) | (hi.view(1, -1) > pos - sel.window_tokens) | whole
            forced[:, c : c + n] = must & seen.view(-1, 1)
            c += n
        usable = self.length > 0
        self.forced = forced & usable
        self.context = (visible & usable).long() @ self.length  # (R,) resident context tokens per row
        self.context_total = int(self.context.sum())
        width = max(int(self.forced.sum(1).max()) if r else 0, 1)
        order = torch.sort(self.forced.int(), dim=1, descending=True, stable=True).indices[:, :width]
        self.forced_ids = torch.where(self.forced.gather(1, order), order, -1)
        device = self.batch.pool.device
        if self.owner.on_demand:
            self.hosted = torch.zeros(self.n_chunks, dtype=torch.bool, device=device)
            if self.hosted_ids:
                self.hosted[torch.cat(self.hosted_ids).to(device)] = True
            self.demand = torch.zeros(self.n_chunks, dtype=torch.float32, device=device)
        self.slots, self.target = self.slots.to(device), self.target.to(device)
        self.length, self.forced = self.length.to(device), self.forced.to(device)
        self.forced_ids = self.forced_ids.to(device)
        if not self.owner.on_demand:  # the flat selection's table (the demand needs candidate lists)
            self.smallest = self.length.sort().values.cumsum(0)
            readable = (visible & usable).to(device)
            base = torch.zeros(r, self.n_chunks, device=device).masked_fill_(~readable, float("-inf"))
            self.base = base.masked_fill_(self.forced, float("inf")).unsqueeze(1)
        for plan in self.plans:
            plan.rows = None if plan.rows is None else plan.rows.to(device)

    # ---- per layer -----------------------------------------------------------------------------
    def reads_whole(self, layer: int) -> bool:
        """Whether ``layer`` reads every resident token (a policy's ``dense_layers``), so the backend attends
        it dense, without the selection or the gather (then :meth:`count_whole`). Not on demand: there every
        layer's selection counts the rehydration demand."""
        owner = self.owner
        return layer in owner.whole_layers and not owner.on_demand

    def count_whole(self) -> None:
        """A layer read whole (:meth:`reads_whole`) in the stats: every resident context token, per KV head."""
        owner = self.owner
        read = self.context_total * owner.store.shape.kv_heads
        owner.stats.read_tokens += read
        owner.stats.context_tokens += read

    def attend(
        self, layer: int, qg: torch.Tensor, own_out: torch.Tensor, own_lse: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention over the chosen chunks, merged with the own-token partials.

        Args:
            qg: (R, H, g, D) queries grouped by KV head (q = 1).
            own_out / own_lse: (R, H, g, D) / (R, H, g) partials of the rows' own tokens.
        Returns:
            out (R, H, g, D) float32 and lse (R, H, g) over the chosen chunks (with ``rerank``, the
            best of their keys) and the own tokens; with statistics on, the read keys' attention mass
            is added to their pieces.
        """
        owner = self.owner
        start = owner.clock()
        chosen, take = self._select(layer, qg)  # (R, H, K) step chunk ids, bool
        mid = owner.clock()
        slots, valid, at = self._candidates(chosen, take)  # (R, H, S)
        q = qg.float()
        target = None
        if self.batch.stats:  # each read token's place in the pieces
            target = self.target[chosen].view(*chosen.shape[:2], -1)
            target = target if at is None else target.gather(-1, at)
        if owner.select.rerank:
            forced = self._forced_tokens(chosen, at)
            scores, values, pick, valid = self._rerank(layer, q, slots, valid, forced, scale)
            target = None if target is None else target.gather(-1, pick)
        else:
            keys, values = gather_heads(self.batch.pool, layer, slots.clamp(min=0), self.batch.groups)
            scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scale  # (R, H, g, S)
        scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.matmul(torch.softmax(scores, dim=-1).nan_to_num_(0.0), values.float())
        out, lse = merge_partials(own_out, own_lse, out, lse)
        if target is not None:
            self._collect(scores, lse, target, valid)
        owner.stats.index_seconds += mid - start
        owner.stats.attention_seconds += owner.clock() - mid
        owner.stats.read_tokens += int(valid.sum())
        owner.stats.context_tokens += self.context_total * slots.shape[1]
        return out, lse

    def attend_all(
        self, layer: int, qg: torch.Tensor, own_slots: torch.Tensor, own_valid: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """:meth:`attend` with the rows' own tokens in the same gather and one softmax (no partials to
        merge, no own-token pass); the attention layer uses it when no statistics are collected.

        Args:
            qg: (R, H, g, D) queries grouped by KV head (q = 1).
            own_slots / own_valid: (R, n) pool slots of each row's own tokens (the current one included)
                and which are real.
        Returns:
            (R, H, g, D) float32.
        """
        owner = self.owner
        start = owner.clock()
        chosen, take = self._select(layer, qg)  # (R, H, K)
        mid = owner.clock()
        slots, valid, at = self._candidates(chosen, take)  # (R, H, S)
        r, h, s = slots.shape
        n = own_slots.shape[1]
        q = qg.float()
        read = int(valid.sum())
        all_slots = torch.cat([slots, own_slots.view(r, 1, n).expand(r, h, n)], -1)
        all_valid = torch.cat([valid, own_valid.view(r, 1, n).expand(r, h, n)], -1)
        if owner.select.rerank:  # the own tokens are read on top of the budget, past the cut
            forced = self._forced_tokens(chosen, at)
            scores, values, pick, keep = self._rerank(layer, q, all_slots, all_valid, forced, scale, n)
            scores = scores.masked_fill(~keep.unsqueeze(2), float("-inf"))  # every row keeps its current token
            out = torch.matmul(torch.softmax(scores, dim=-1), values.float())
            read = int(keep[..., : keep.shape[-1] - n].sum())
        elif owner.native_read():  # the chosen K/V read where they lie, not copied out first
            settle_restores(self.batch.pool, layer, self.batch.groups)
            out = native.gather_attend(self.batch.pool, layer, q, all_slots, all_valid, scale)
        else:
            keys, values = gather_heads(self.batch.pool, layer, all_slots.clamp(min=0), self.batch.groups)
            mask = all_valid.unsqueeze(2)  # (R, H, 1, S): every row reads at least its current token
            out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale)
        owner.stats.index_seconds += mid - start
        owner.stats.attention_seconds += owner.clock() - mid
        owner.stats.read_tokens += read
        owner.stats.context_tokens += self.context_total * h
        return out

    def _candidates(
        self, chosen: torch.Tensor, take: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The chosen chunks' tokens: pool slots (R, H, S), which are read (R, H, S) and each one's place
        ``at`` (R, H, S) in the chunks' (R, H, K x W) tables, or None when they are those tables.

        With ``rerank`` the read tokens are packed to the front (a chunk's table is W wide, its tokens
        may be fewer), so the candidates' key gather, scores and top-k skip the padding (S = the most
        any row and head holds); the plain read gathers the tables as they are (packed, the defaults
        decoded at the same 1.22x dense on the suite's 8K items: docs/data/longctx-rerank against
        docs/data/longctx-default, measured before packing)."""
        slots = self.slots[chosen]  # (R, H, K, W)
        r, h, k, w = slots.shape
        slots = slots.view(r, h, k * w)
        read = (slots >= 0) & take.unsqueeze(-1).expand(r, h, k, w).reshape(r, h, k * w)
        if not self.owner.select.rerank:
            return slots, read, None
        at, real = pack(read)
        return slots.gather(-1, at), real, at

    def _forced_tokens(self, chosen: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """(R, H, S) bool: which of the :meth:`_candidates` tokens (places ``at``) are in a chunk the last
        selection scored +inf (``must``): the sinks, the window, blocks read whole, every chunk at a dense
        layer (``dense_layers``)."""
        r, h, k = chosen.shape
        w = self.slots.shape[1]
        return self.must.unsqueeze(-1).expand(r, h, k, w).reshape(r, h, k * w).gather(-1, at)

    def _rerank(
        self,
        layer: int,
        q: torch.Tensor,
        slots: torch.Tensor,
        valid: torch.Tensor,
        forced: torch.Tensor,
        scale: float,
        own: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The token cut of ``select.rerank``: every candidate key is scored exactly and each row and
        KV head keeps its forced keys and the best others, up to ``token_budget`` keys in all.

        The rank is the max over the group's query heads of q.k (as the oracle's), and the scores are
        the attention's own: the kept keys' scores are not computed again, only their values are gathered.

        Args:
            q: (R, H, g, D) float32; slots / valid: (R, H, S + own) candidate pool slots and which are
                real, the last ``own`` the rows' own tokens (read past the cut); forced: (R, H, S)
                which context candidates must be read.
        Returns:
            scores (R, H, g, k) scaled q.k of the picked keys, values (R, H, k, D), pick (R, H, k) their
            places in S + own (the own tokens last) and keep (R, H, k) bool: which are read.
        """
        pool, groups = self.batch.pool, self.batch.groups
        (keys,) = gather_heads(pool, layer, slots.clamp(min=0), groups, ("keys",))
        scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scale  # (R, H, g, S + own)
        s = slots.shape[-1] - own
        real = valid[..., :s]
        rank = scores[..., :s].amax(2).masked_fill_(~real, float("-inf")).masked_fill_(forced & real, float("inf"))
        top, pick = top_keys(rank, self.owner.select.token_budget)
        if own:
            r, h = pick.shape[:2]
            pick = torch.cat([pick, torch.arange(s, s + own, device=pick.device).expand(r, h, own)], -1)
            top = torch.cat([top, torch.where(valid[..., s:], float("inf"), float("-inf"))], -1)
        self.owner.stats.scored_tokens += int((real & ~forced).sum())
        scores = scores.gather(-1, pick.unsqueeze(2).expand(-1, -1, scores.shape[2], -1))
        (values,) = gather_heads(pool, layer, slots.gather(-1, pick).clamp(min=0), groups, ("values",))
        return scores, values, pick, top > float("-inf")

    def _select(self, layer: int, qg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row and KV head, the chunks to read: (R, H, K) step chunk ids and which are taken."""
        if self.owner.fast and self.base is not None:
            flat = self._select_flat(layer, qg)
            if flat is not None:
                return flat
        sel = self.owner.select
        r, h = qg.shape[0], qg.shape[1]
        q = qg.float()
        forced = self.forced_ids.unsqueeze(1).expand(r, h, -1)
        ids = [forced.clamp(min=0)]
        scores = [torch.where(forced >= 0, float("inf"), float("-inf"))]
        retrieved = []  # (ids, bounds) before resident-only masking, for the rehydration demand
        for plan in self.plans:
            sub = q if plan.rows is None else q.index_select(0, plan.rows)
            got, best = plan.index.retrieve(layer, sub, plan.n, sel.exact)  # (r', H, m)
            got = got + plan.offset
            if plan.rows is not None:
                got = torch.zeros(r, h, got.shape[-1], dtype=got.dtype).index_copy_(0, plan.rows, got)
                best = torch.full((r, h, best.shape[-1]), float("-inf")).index_copy_(0, plan.rows, best)
            again = self.forced.gather(1, got.view(r, -1)).view_as(got) | (self.length[got] == 0)
            retrieved.append((got, best))
            ids.append(got)
            scores.append(best.masked_fill(again, float("-inf")))
        ids, scores = torch.cat(ids, -1), torch.cat(scores, -1)
        scores, order = scores.sort(dim=-1, descending=True)
        ids = ids.gather(-1, order)
        size = self.length[ids]
        before = size.cumsum(-1) - size
        take = torch.isfinite(scores) & (before < sel.candidate_tokens) | (scores == float("inf"))
        if self.demand is not None and retrieved:
            self._count_demand(retrieved, scores, take, size)
        k = max(int(take.sum(-1).max()), 1)
        self.must = scores[..., :k] == float("inf")
        return ids[..., :k], take[..., :k]

    def _select_flat(self, layer: int, qg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`_select` when every index scores all its chunks (a flat scan): one (R, H, C) score
        table over the step's chunks, forced ones +inf and unreadable ones -inf (``base``), one sort,
        the budget cut. The same choice as the candidate lists (they are each index's top chunks by
        the same scores) in a fraction of the operations; None when an index does not scan flat."""
        scores = self._flat_scores(layer, qg.float())
        if scores is None:
            return None
        scores = (scores + self.base).nan_to_num_(float("-inf"), float("inf"), float("-inf"))  # inf - inf: unread
        scores, ids = scores.topk(self._most_taken(scores), dim=-1)  # sorted: the full sort's cut, cheaper
        size = self.length[ids]
        before = size.cumsum(-1) - size
        take = torch.isfinite(scores) & (before < self.owner.select.candidate_tokens) | (scores == float("inf"))
        k = max(int(take.sum(-1).max()), 1)
        self.must = scores[..., :k] == float("inf")
        return ids[..., :k], take[..., :k]

    def _most_taken(self, scores: torch.Tensor) -> int:
        """The most chunks the budget cut can take of a row from ``scores`` (R, H, C): those scored
        +inf (forced, or every chunk at a dense layer), plus m + 1 where m is
        the most chunks whose lengths stay below the budget (the m smallest). Each taken chunk starts
        below the budget, so the ones before it weigh less than the budget: no more than m of them.
        Ranking only this many (``topk``) gives the full sort's cut: a sixth of the time over 2K chunks."""
        reads = self.owner.select.candidate_tokens
        fitting = int(torch.searchsorted(self.smallest, reads))  # prefix sums below the budget
        forced = int((scores == float("inf")).sum(-1).max()) if scores.numel() else 0
        return min(self.n_chunks, forced + fitting + 1)

    def _flat_scores(self, layer: int, q: torch.Tensor) -> torch.Tensor | None:
        """(R, H, C) float32 every step chunk's score for queries q (R, H, g, D): each index's
        ``scores`` at its chunks, 0 elsewhere; None when an index does not scan flat. One index over
        every row and chunk (a single long context) gives its own table, not a copy (read only)."""
        r, h = q.shape[0], q.shape[1]
        scores = None
        for plan in self.plans:
            sub = q if plan.rows is None else q.index_select(0, plan.rows)
            got = plan.index.scores(layer, sub)  # (r', H, c) or None
            if got is None:
                return None
            if len(self.plans) == 1 and plan.rows is None and got.shape[-1] == self.n_chunks:
                return got
            if scores is None:
                scores = torch.zeros(r, h, self.n_chunks, device=q.device)
            end = plan.offset + got.shape[-1]
            if plan.rows is None:
                scores[:, :, plan.offset : end] = got
            else:
                scores[plan.rows, :, plan.offset : end] = got
        return torch.zeros(r, h, self.n_chunks, device=q.device) if scores is None else scores  # no index: 0

    def _count_demand(self, retrieved, scores: torch.Tensor, take: torch.Tensor, size: torch.Tensor) -> None:
        """This layer's rehydration demand into ``self.demand`` (:func:`~arbor_runtime.sparse.demand.count_demand`)."""
        count_demand(self.demand, self.hosted, self.owner.select.candidate_tokens, retrieved, scores, take, size)

    def _collect(self, scores: torch.Tensor, lse: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> None:
        """Attention mass of the read keys (scores (R, H, g, S), their pieces' places ``target`` (R, H, S))
        into their blocks' pieces (``Group.mass``)."""
        mass = torch.exp(scores - lse.unsqueeze(-1)).sum(2)  # (R, H, S): zero where masked
        flat = torch.zeros(self.n_tokens, dtype=torch.float32, device=mass.device)
        flat.index_add_(0, target[valid], mass[valid])
        for grp, offsets in zip(self.batch.groups, self.piece_offsets, strict=True):
            for i, (piece, off) in enumerate(zip(grp.pieces, offsets, strict=True)):
                grp.mass[i] += flat[off : off + piece.length]


# ---- helpers ---------------------------------------------------------------------------------
def _layout(grp: Group, index: BlockIndex | None, width: int):
    """One block's chunk tables from its pieces.

    Returns slots (C, W) pool slots of each chunk's resident tokens (-1 padded), target (C, W)
    each token's place in the concatenation of the block's pieces, and the chunks' block-local
    token ranges lo / hi (C,). A block read whole is cut into runs of ``width`` resident tokens.
    """
    idx = torch.cat([p.idx for p in grp.pieces])
    slot = torch.cat([torch.arange(p.start, p.start + p.length) for p in grp.pieces])
    order = torch.argsort(idx)
    if index is None:  # read whole: runs of ``width`` resident tokens, positions unused
        chunk = torch.arange(int(idx.numel())) // width
        c = -(-int(idx.numel()) // width)
        lo = hi = torch.zeros(c, dtype=torch.long)
    else:
        chunk = torch.searchsorted(index.starts, idx[order], right=True) - 1
        c = index.n_chunks
        lo, hi = index.starts[:-1], index.starts[1:]
    first = torch.searchsorted(chunk, chunk, right=False)
    rank = torch.arange(int(idx.numel())) - first
    slots = torch.full((c, width), -1, dtype=torch.long)
    target = torch.full((c, width), -1, dtype=torch.long)
    slots[chunk, rank] = slot[order]
    target[chunk, rank] = order
    return slots, target, lo, hi


def pack(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Places of the True entries of ``keep`` (R, H, S), in order, packed to the front: ``at`` (R, H, S')
    and which of them are real (R, H, S'), S' the most True of any row and head (a cumsum and a scatter,
    no sort)."""
    r, h, s = keep.shape
    count = keep.sum(-1, keepdim=True)  # (R, H, 1)
    width = max(int(count.max()) if keep.numel() else 0, 1)
    dest = torch.where(keep, keep.cumsum(-1) - 1, width)  # the False ones to a spare last column
    places = torch.arange(s, device=keep.device).expand(r, h, s)
    at = torch.zeros(r, h, width + 1, dtype=torch.long, device=keep.device).scatter_(-1, dest, places)
    return at[..., :width], torch.arange(width, device=keep.device) < count


def top_keys(rank: torch.Tensor, reads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The budget cut over exact ranks (R, H, S) (+inf: forced, -inf: not readable): the forced keys and
    the best others, ``reads`` in all (more when a row has more forced). Returns (R, H, k) ranks and
    places; -inf ranks are padding. Unsorted unless some row's forced keys pass the budget (a top-k
    that need not order its picks costs a third of one that does)."""
    forced = int((rank == float("inf")).sum(-1).max()) if rank.numel() else 0
    k = min(rank.shape[-1], max(reads, forced))
    if forced <= reads:
        return rank.topk(k, dim=-1, sorted=False)
    top, pick = rank.topk(k, dim=-1)  # sorted: the forced first, then the others until ``reads``
    late = torch.isfinite(top) & (torch.arange(k, device=top.device) >= reads)
    return top.masked_fill(late, float("-inf")), pick


def gather_heads(pool, layer: int, slots: torch.Tensor, groups, parts=("keys", "values")) -> tuple[torch.Tensor, ...]:
    """K and V (``parts``: which of them, in order) at per-head slots (R, H, S) of one layer:
    (R, H, S, D) each (a copy).

    Restores in flight into the context's segments are waited for first (on CUDA, per layer).
    """
    settle_restores(pool, layer, groups)
    r, h, s = slots.shape
    heads = torch.arange(h, device=slots.device).view(1, h, 1)
    d = pool.shape.head_dim
    out = None
    for arena in pool.arenas:  # the first arena gathers every slot; the others fix up their own few
        cap = arena.capacity
        tables = [getattr(arena, part)[layer].reshape(h * cap, d) for part in parts]  # (H * cap, D) each
        flat = ((slots - arena.base).clamp(0, cap - 1) + heads * cap).reshape(-1)
        if out is None:
            out = [t.index_select(0, flat) for t in tables]
            continue
        pick = torch.nonzero(((slots >= arena.base) & (slots < arena.end)).reshape(-1)).squeeze(1)
        if pick.numel():
            rows = flat.index_select(0, pick)
            for got, t in zip(out, tables, strict=True):
                got.index_copy_(0, pick, t.index_select(0, rows))
    return tuple(t.view(r, h, s, d) for t in out)


def settle_restores(pool, layer: int, groups) -> None:
    """Wait for restores in flight into the groups' context segments of ``layer`` (on CUDA; a no-op
    without a busy prefetcher), before their keys or values are read."""
    prefetcher = getattr(pool, "prefetcher", None)
    if prefetcher is not None and prefetcher.busy:
        for grp in groups:
            for p in grp.pieces:
                prefetcher.wait(layer, p.start, p.start + p.length)
