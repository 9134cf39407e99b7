"""Rows being generated: their state, their pool slots, one decode step's batch, and sampling.

A row is one child thought in flight. It samples from its own random stream (seeded from the
call's seed and the child's node id), so what it samples never depends on which rows share its
batch, or on whether it was preempted and restarted. A row's first token is sampled from its
parent's stored next-token logits; every sampled token is then fed once, so a finished block's
KV is complete and the distribution after it is kept for its future children.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from arbor_runtime.attention.tree import Read, TreeBatch, context_groups, group_reads
from arbor_runtime.batch import Group
from arbor_runtime.grammar import Matcher, mask_logits
from arbor_runtime.kv import Extent, KVStore
from arbor_runtime.kv.block import layout_epoch
from arbor_runtime.sampling import SamplingParams, draw_rows
from arbor_runtime.tree import Node


@dataclass(slots=True, eq=False)  # a row is compared by identity: the engine's lists remove and find rows
class Row:
    """One child being generated.

    Attributes:
        owner: the node being expanded; child_id: the id its child will get (fixed up front).
        order: its index in the call's request order; seed: its sampling stream's seed.
        job: the expansion it belongs to (the engine's bookkeeping).
        stop: decides when it ends; its ``params`` are how it samples (one per request of the job).
        matcher: its grammar state when it samples under a regex or grammar, else None.
        tokens / logprobs / entropies: what was sampled so far.
        fed: tokens whose KV the model has computed (<= len(tokens)).
        stop_reason: set once the row has sampled its last token.
        next_logits: (V,) logits after the final token, set when the row is done.
        extents: the pool slots admitted for its tokens (token i sits in the i-th slot).
        attention: (capacity,) attention mass its own tokens received from its later queries.
        head_attention: (L, H_kv, n) the same per layer and KV head (per-head statistics only; None
            until a step records them).
        scored: its decode steps whose attention was recorded (statistics may be off; see
            ``MemoryPlanner.records_statistics``).
    """

    owner: Node
    child_id: int
    order: int
    seed: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    fed: int = 0
    stop_reason: str = ""
    next_logits: torch.Tensor | None = None
    extents: list[Extent] = field(default_factory=list)
    attention: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    head_attention: torch.Tensor | None = None
    scored: int = 0
    generator: torch.Generator = field(default_factory=torch.Generator)
    job: Any = None
    stop: StopChecker | None = None
    matcher: Matcher | None = None
    #: when it last joined the scheduler's waiting rows (metrics: wait_seconds)
    queued_at: float = field(default_factory=time.perf_counter)
    #: (the extents, their slots) the last :meth:`slots` worked out
    _slots_of: tuple[tuple[Extent, ...], list[int]] = field(default=((), []), repr=False)

    def __post_init__(self) -> None:
        self.generator.manual_seed(self.seed)

    @property
    def start_pos(self) -> int:
        return self.owner.end_pos

    @property
    def done(self) -> bool:
        return self.next_logits is not None

    @property
    def capacity(self) -> int:
        return sum(e.length for e in self.extents)

    def slots(self, n: int) -> list[int]:
        """Pool slots of the row's first n tokens (the slots of its extents, kept until they change), a list:
        a decode step builds its batch from every row's in one tensor call."""
        key = tuple(self.extents)
        if key != self._slots_of[0]:
            self._slots_of = (key, [slot for e in key for slot in range(e.start, e.end)])
        return self._slots_of[1][:n]

    def add_slots(self, extents: Sequence[Extent], joins: Callable[[Extent, Extent], bool] | None = None) -> None:
        """Admitted slots: merged into the last extent when they continue it (``joins(last, ext)``:
        the pool's rule, which never lets an extent cross an arena; default: consecutive slots)."""
        for ext in extents:
            last = self.extents[-1] if self.extents else None
            if last is not None and (joins(last, ext) if joins is not None else last.end == ext.start):
                self.extents[-1] = Extent(last.start, last.length + ext.length)
            else:
                self.extents.append(ext)
        grown = self.capacity - int(self.attention.numel())
        self.attention = torch.cat([self.attention, torch.zeros(grown)])

    def restart(self) -> list[Extent]:
        """Back to the state before its first token (preemption); returns the slots it gave up."""
        gone = self.extents
        self.tokens, self.logprobs, self.entropies, self.extents = [], [], [], []
        self.fed, self.stop_reason, self.next_logits = 0, "", None
        self.attention, self.scored, self.head_attention = torch.zeros(0), 0, None
        self.generator.manual_seed(self.seed)
        if self.matcher is not None:
            self.matcher.reset()
        return gone


class StopChecker:
    """Decides when a row's thought ends: stop string, EOS, or length."""

    def __init__(self, tokenizer: object, params: SamplingParams, eos_ids: set[int]) -> None:
        self.tokenizer, self.params, self.eos_ids = tokenizer, params, eos_ids
        self._tail = max((len(s) for s in params.stop), default=0)

    def reason(self, row: Row) -> str:
        """ "" while the row goes on, else "eos" | "stop" | "grammar" | "length"."""
        if self.params.stop_at_eos and row.tokens[-1] in self.eos_ids:
            return "eos"
        if self.params.stop and self._has_stop(row.tokens):
            return "stop"
        if row.matcher is not None and row.matcher.stopped:
            return "grammar"
        if len(row.tokens) >= self.params.max_new_tokens:
            return "length"
        return ""

    def _has_stop(self, tokens: list[int]) -> bool:
        # Only a stop string that ends in the newest token can be new; decode a short tail.
        tail = self.tokenizer.decode(tokens[-(self._tail + 2) :])
        return any(s in tail for s in self.params.stop)


def sample_into(rows: Sequence[Row], logits: torch.Tensor, params: SamplingParams, stop: StopChecker) -> None:
    """Sample one token for each row from (B, V) logits, each from its own stream; record stats.

    Under a regex or grammar the draw is restricted to each row's allowed tokens; the recorded
    log-probs and entropies are those of the raw distribution either way.
    """
    scores = mask_logits(logits, [r.matcher for r in rows]) if params.constrained else logits
    tokens, logprobs, entropies = draw_rows(logits, scores, params, [r.generator for r in rows])
    for row, tok, lp, ent in zip(rows, tokens.tolist(), logprobs.tolist(), entropies.tolist(), strict=True):
        row.tokens.append(tok)
        row.logprobs.append(lp)
        row.entropies.append(ent)
        if row.matcher is not None:
            row.matcher.advance(tok)
        row.stop_reason = stop.reason(row)


class DecodeLayout:
    """What a decode step's rows read (their paths' block ids, the context groups and how each group is
    read), kept from one step to the next while the same rows run and no block's device layout changed
    (:func:`~arbor_runtime.kv.block.layout_epoch`): a long expansion works it out once, not every step."""

    def __init__(self) -> None:
        self._rows: tuple[Row, ...] = ()
        self._epoch = -1
        self._value: tuple[list[list[int]], list[Group], list[list[Read]]] | None = None

    def of(self, store: KVStore, rows: Sequence[Row]) -> tuple[list[list[int]], list[Group], list[list[Read]]]:
        """(each row's context block ids in path order, the context groups, their reads)."""
        epoch = layout_epoch()
        same = len(rows) == len(self._rows) and all(a is b for a, b in zip(rows, self._rows, strict=True))
        if self._value is None or epoch != self._epoch or not same:
            contexts = [[n.id for n in row.owner.kv_path()] for row in rows]
            groups = context_groups(store, contexts)
            self._value = (contexts, groups, group_reads(groups, store.pool.device))
            self._rows, self._epoch = tuple(rows), epoch
        return self._value


def decode_batch(
    store: KVStore, rows: Sequence[Row], stats: bool, kernel, layout: DecodeLayout | None = None
) -> tuple[TreeBatch, torch.Tensor, torch.Tensor]:
    """The batch that feeds every row its newest unfed token.

    Returns the :class:`TreeBatch` (contexts = the rows' paths, read in place; own tokens = their
    slots so far plus this step's), input ids (R, 1) and position ids (R, 1). ``layout``: what the
    rows read, kept across steps (None: worked out for this step alone).
    """
    contexts, groups, reads = (layout or DecodeLayout()).of(store, rows)
    slots = [row.slots(row.fed + 1) for row in rows]
    width = max(len(s) for s in slots)
    own = torch.tensor([s + s[:1] * (width - len(s)) for s in slots])  # (R, width), padded with a real slot
    valid = torch.arange(width) < torch.tensor([[len(s)] for s in slots])  # (R, width)
    write = own.gather(1, torch.tensor([[r.fed] for r in rows]))  # (R, 1): this step's token
    batch = TreeBatch(
        store.pool, groups, len(rows), 1, write, own, valid, stats, kernel, reads=reads, head_stats=store.head_stats
    )
    batch.context_ids = contexts
    ids = torch.tensor([[r.tokens[r.fed]] for r in rows])
    pos = torch.tensor([[r.start_pos + r.fed] for r in rows])
    return batch, ids, pos


def add_own_attention(rows: Sequence[Row], batch: TreeBatch) -> None:
    """Attention mass the step's queries gave each row's own tokens (the batch's rows, in order)."""
    if batch.own_mass is not None:
        for i, row in enumerate(rows):
            row.attention[: row.fed + 1] += batch.own_mass[i, : row.fed + 1].float().cpu()
            row.scored += 1
    if batch.own_head_mass is not None:
        own_head_mass = batch.own_head_mass.float().cpu()
        for i, row in enumerate(rows):
            n = row.fed + 1
            if row.head_attention is None or row.head_attention.shape[-1] < n:
                grown = torch.zeros(*own_head_mass.shape[1:3], int(row.attention.numel()))
                if row.head_attention is not None:
                    grown[..., : row.head_attention.shape[-1]] = row.head_attention
                row.head_attention = grown
            row.head_attention[..., :n] += own_head_mass[i, ..., :n]


def postprocess(rows: Sequence[Row], logits: torch.Tensor, params: SamplingParams, stop: StopChecker) -> list[Row]:
    """After a step: finished rows keep their next logits, the rest sample their next token.

    logits: (R, V), one row per entry of ``rows``. Returns the rows that finished this step.
    """
    finished, going = [], []
    for i, row in enumerate(rows):
        row.fed += 1
        if row.stop_reason:
            row.next_logits = logits[i].float().cpu().clone()
            finished.append(row)
        else:
            going.append(i)
    if len(going) == len(rows):  # the usual step: no row ended, so no (R, V) copy of the logits
        sample_into(rows, logits, params, stop)
    elif going:
        sample_into([rows[i] for i in going], logits[going], params, stop)
    return finished
