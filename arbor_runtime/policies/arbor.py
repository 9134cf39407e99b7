"""ArborKV: MSVE block values + Tree-Aware Allocation (TAE), token-extractive, with a host tier.

- The active path (every node about to be expanded and its ancestors) stays whole; before each
  expansion the runtime brings its evicted tokens back (lazy rehydration, or recompute when a
  span was dropped from every tier).
- Global sinks (the first tokens of each root) and each block's tail stay.
- Inactive blocks get a retention ratio from their MSVE value and topology (``distance_decay``
  per tree edge from the active path), water-filled to fit the budget; inside a block the
  highest-attention tokens stay (token-extractive: no summaries).
- Evicted spans go to the host tier; with ``host_budget_tokens`` set, the lowest-value spans
  are dropped when the host is full (they come back by recompute): arbor ranks them by MSVE value,
  the planner drops as many as the cap needs.
- Below the floor (the active path plus a lone row's new tokens do not fit whole; the planner
  decides it and pins what must stay: sinks, the frontier block, the prompt outside its few-shot
  examples, the frontier's parent) the allocation goes on into the active path: every inactive
  block leaves for the host, and the path keeps its pinned tokens plus its other tokens ranked by
  attention per query, the resident ones and those on the host alike (the plan brings the best
  back). A later operation that fits whole makes the path whole again (exact from there on).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch

from arbor_runtime.events import BranchSwitch, Event
from arbor_runtime.policies.allocation import fit_floors, head_top_tokens, top_tokens, water_fill, whole_blocks
from arbor_runtime.policies.base import BlockView, Capabilities, MemoryView, Policy, RetentionPlan
from arbor_runtime.policies.kvp import KVPScores
from arbor_runtime.policies.msve import SIGNALS, MSVEWeights, block_values
from arbor_runtime.policies.scorer import GRANULARITIES

TOKEN_SCORERS = ("attention", "kvp")
#: ``msve``: every signal (the calibration as fitted), none (every block the same value), or one alone
MSVE_MODES = ("all", "off", *SIGNALS)
#: the pins ``pins`` may leave out (the frontier block always stays: the row writes below it)
OPTIONAL_PINS = ("sinks", "question", "parent")


@dataclass(slots=True)
class ArborPolicy(Policy):
    """ArborKV (MSVE + TAE).

    Attributes:
        sink_tokens: first tokens of each root kept on device.
        tail_tokens: last tokens of each block kept on device.
        distance_decay: retention weight factor per edge between a block and the active path.
        min_ratio: smallest share of an inactive block's tokens the allocation aims to keep.
        calibration: MSVE calibration JSON path (None = the file shipped with the package, else
            the defaults of :class:`MSVEWeights`).
        host_budget_tokens: cap on host-tier tokens (None: the runtime caps it at ``kv.host.HOST_SHARE``
            of the host memory available when it starts).
        token_scorer: how tokens are chosen inside a block: ``attention`` (accumulated attention,
            the paper's choice) or ``kvp`` (the learned KVP scorers, :mod:`~arbor_runtime.policies.kvp`).
        kvp_weights: KVP weights file for ``token_scorer=kvp`` (None = the file shipped for the model).
        vocab_size: for entropy normalization (set by the runtime).
        degrade: below the floor keep running, token-extracting the active path (see the module
            docstring); False: the all-or-nothing ArborKV of the paper (an OOM below the floor).
        msve: the value signals read (:data:`MSVE_MODES`): ``all``; ``off`` (every inactive block the
            same value); or one of search, uncertainty, attention, depth alone (that signal's own fit
            from the calibration's ``single``, else its weight in the full fit; the others 0).
            The parts below are switches for the ablation (issue 65).
        topology: inactive blocks' retention decays by ``distance_decay`` per edge from the active
            path; False: by value alone.
        extract: inside an inactive block the best tokens stay (token-extractive); False: whole blocks
            stay or leave, highest weight first while they fit.
        host_tier: evicted spans wait on the host tier and come back (lazy rehydration); False: they are
            dropped (no rehydration), and a path made whole again is recomputed.
        pins: which of :data:`OPTIONAL_PINS` the planner pins below the floor (with the frontier block).
        granularity: ``token``: a token kept inside an inactive block keeps its K/V in every layer and KV
            head; ``head``: each layer and KV head keeps its own best tokens there, the same count in
            each (by its own attention record, or its own KVP scorer), and its evicted K/V wait on the
            host per head and come back bit-identical. The active path is whole either way, and
            below the floor it is pinned and extracted by whole tokens.
        weights: the MSVE weights read from ``calibration`` (not a constructor argument).
    """

    name = "arbor"
    CAPABILITIES = Capabilities(offload=True, keep_active_whole=True, needs_attention=True, stats_on_pressure=True)

    sink_tokens: int = 4
    tail_tokens: int = 2
    distance_decay: float = 0.7
    min_ratio: float = 0.0
    calibration: str | None = None
    host_budget_tokens: int | None = None
    vocab_size: int = 32000
    token_scorer: str = "attention"
    kvp_weights: str | None = None
    degrade: bool = True
    msve: str = "all"
    topology: bool = True
    extract: bool = True
    host_tier: bool = True
    pins: Sequence[str] = OPTIONAL_PINS
    granularity: str = "token"
    weights: MSVEWeights = field(init=False, repr=False)
    kvp: KVPScores | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        Policy.__post_init__(self)
        if not 0.0 < self.distance_decay <= 1.0:
            raise ValueError(f"distance_decay={self.distance_decay} must be in (0, 1]")
        if self.token_scorer not in TOKEN_SCORERS:
            raise ValueError(f"arbor token_scorer={self.token_scorer!r}; valid: {', '.join(TOKEN_SCORERS)}")
        host = self.host_budget_tokens
        if host is not None and (isinstance(host, bool) or not isinstance(host, int) or host < 0):
            raise ValueError(
                f"host_budget_tokens={host!r} must be an integer >= 0, or None (the runtime's default: half "
                "the available host memory)"
            )
        for switch in ("degrade", "topology", "extract", "host_tier"):
            if not isinstance(getattr(self, switch), bool):
                raise ValueError(f"arbor {switch}={getattr(self, switch)!r} must be true or false")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"arbor granularity={self.granularity!r}; valid: {', '.join(GRANULARITIES)}")
        if self.msve not in MSVE_MODES:
            raise ValueError(f"arbor msve={self.msve!r}; valid: {', '.join(MSVE_MODES)}")
        self.pins = _pins(self.pins)
        if not self.host_tier and host:
            raise ValueError(f"arbor host_budget_tokens={host} caps a host tier that host_tier=false does not use")
        if isinstance(self.sink_tokens, bool) or not isinstance(self.sink_tokens, int) or self.sink_tokens < 0:
            raise ValueError(f"arbor sink_tokens={self.sink_tokens!r} must be a number of tokens >= 0")
        if self.msve in SIGNALS:
            self.weights = MSVEWeights.alone(self.calibration, self.msve)
        else:
            weights = MSVEWeights.load(self.calibration)
            self.weights = weights if self.msve == "all" else weights.only(None)
        self.kvp = KVPScores(self.kvp_weights) if self.token_scorer == "kvp" else None

    @property
    def capabilities(self) -> Capabilities:
        """Arbor's, with ``degrades``, what the planner pins below the floor, and whether evicted
        spans wait on the host tier."""
        pins = frozenset({"frontier", *self.pins})
        return replace(
            self.CAPABILITIES, degrades=self.degrade, sink_tokens=self.sink_tokens, offload=self.host_tier, pins=pins
        )

    def bind(self, model) -> None:
        """Called by the runtime with its model: loads the KVP weights when tokens are chosen by KVP."""
        if self.kvp is not None:
            self.kvp.bind(model)

    def on_event(self, event: Event, view: MemoryView) -> RetentionPlan | None:
        if isinstance(event, BranchSwitch):
            return None  # the runtime rehydrates the new active path right before expanding it
        return Policy.on_event(self, event, view)

    def plan(self, view: MemoryView) -> RetentionPlan | None:
        if view.pinned is not None:
            return self._below_floor(view)
        values = block_values(view.blocks, self.weights, self.vocab_size)
        inactive = [b for b in view.blocks if not b.active]
        active_tokens = sum(b.kv.kept_tokens for b in view.blocks if b.active)
        capacity = max(view.target - active_tokens, 0)
        sizes = [b.kv.kept_tokens for b in inactive]
        if sum(sizes) <= capacity:
            return None
        decay = self.distance_decay if self.topology else 1.0
        weights = [values[b.node.id] * decay ** _distance(b, view.active) for b in inactive]
        plan = RetentionPlan()
        if self.extract:
            self._extract(plan, view, inactive, weights, capacity)
        else:
            for b, n, size in zip(inactive, whole_blocks(sizes, weights, capacity), sizes, strict=True):
                if n < size:
                    plan.keep[b.node.id] = b.kv.kept[:0].cpu()
        # lowest value first: under a host cap the planner forgets host spans in this order
        plan.host_order = sorted((b.node.id for b in view.blocks), key=lambda i: values.get(i, 0.0))
        return plan

    def _extract(
        self, plan: RetentionPlan, view: MemoryView, inactive: list[BlockView], weights: list[float], capacity: int
    ) -> None:
        """Into ``plan``: each inactive block's share of ``capacity`` (water-filled by ``weights`` above
        its protected tokens), filled with its best tokens."""
        sizes = [b.kv.kept_tokens for b in inactive]
        protected = [self._protected(b) for b in inactive]
        floors = [
            min(max(int(torch.isin(b.kv.kept.cpu(), p).sum()), int(self.min_ratio * s)), s)
            for b, p, s in zip(inactive, protected, sizes, strict=True)
        ]
        floors = fit_floors(floors, weights, capacity)
        alloc = water_fill(sizes, floors, weights, capacity)
        scores = self.kvp.block_token_scores(view) if self.kvp is not None else {}
        for b, n, size, must in zip(inactive, alloc, sizes, protected, strict=True):
            if n < size:
                plan.keep[b.node.id] = top_tokens(b.kv.kept, scores.get(b.node.id, _token_values(b)), must, n)
                if self.granularity == "head":
                    plan.heads[b.node.id] = self._head_tokens(view, b, must, n)

    def _head_tokens(self, view: MemoryView, b: BlockView, must: torch.Tensor, n: int) -> torch.Tensor:
        """(L, H_kv, n) each layer's and KV head's best ``n`` of the tokens it holds in an inactive block:
        ``must`` first, then by its own KVP score or attention record (its recency before any query
        was recorded)."""
        held = b.kv.head_tokens(*view.kv_shape)
        if self.kvp is not None:
            scores = self.kvp.held_scores(b.node.id, held)
        elif b.kv.observers > 0 and b.kv.head_attention is not None:
            scores = b.kv.head_attention.gather(2, held)
        else:
            scores = held.float()
        return head_top_tokens(held, scores, must, n)

    def _below_floor(self, view: MemoryView) -> RetentionPlan:
        """Every inactive block leaves; the active path keeps its pinned tokens and its best other
        tokens (device or host), by attention per query, up to ``view.target``."""
        plan = RetentionPlan()
        for b in view.blocks:
            if not b.active and b.kv.kept_tokens:
                plan.keep[b.node.id] = b.kv.kept[:0].cpu()
        active = [b for b in view.blocks if b.active]
        pinned = [view.pinned.get(b.node.id, _EMPTY) for b in active]
        room = view.target - sum(int(p.numel()) for p in pinned)
        others = [_held(b)[~torch.isin(_held(b), p)] for b, p in zip(active, pinned, strict=True)]
        scores = torch.cat([_per_query(b)[o] for b, o in zip(active, others, strict=True)] + [torch.zeros(0)])
        best = torch.zeros(scores.numel(), dtype=torch.bool)
        if room > 0 and scores.numel():
            best[torch.topk(scores, min(room, scores.numel())).indices] = True
        offset = 0
        for b, p, o in zip(active, pinned, others, strict=True):
            chosen = o[best[offset : offset + o.numel()]]
            offset += o.numel()
            plan.keep[b.node.id] = torch.sort(torch.cat([p.cpu(), chosen])).values
        return plan

    def _protected(self, b: BlockView) -> torch.Tensor:
        """Block-local indices that stay: the tail, and the sinks for a root block."""
        length = b.kv.length
        tail = torch.arange(max(length - self.tail_tokens, 0), length)
        if b.node.parent is None:
            tail = torch.cat([torch.arange(min(self.sink_tokens, length)), tail])
        return tail


_EMPTY = torch.zeros(0, dtype=torch.long)


def _pins(pins) -> tuple[str, ...]:
    """``pins`` (a list, also Hydra's) as a tuple of :data:`OPTIONAL_PINS`, each once."""
    if isinstance(pins, str) or not isinstance(pins, Iterable):
        raise ValueError(f"arbor pins={pins!r} must be a list of: {', '.join(OPTIONAL_PINS)} (e.g. [sinks,parent])")
    out = tuple(pins)
    bad = [p for p in out if p not in OPTIONAL_PINS]
    if bad or len(set(out)) != len(out):
        what = f"{bad[0]!r} is not a pin" if bad else "names a pin twice"
        raise ValueError(
            f"arbor pins={list(out)}: {what}; valid: {', '.join(OPTIONAL_PINS)} (the frontier always stays)"
        )
    return out


def _token_values(b: BlockView) -> torch.Tensor:
    """(length,) what a block's tokens are worth inside it: the attention they received; for a block no
    scored query has seen yet (statistics are recorded only under memory pressure), their recency, so
    the kept tokens are its tail in one run rather than an arbitrary pick among tied scores."""
    if b.kv.observers > 0:
        return b.kv.attention
    return torch.arange(b.kv.length, dtype=torch.float32)


def _held(b: BlockView) -> torch.Tensor:
    """(N,) block-local tokens some tier holds: on the device, then on the host."""
    return torch.cat([b.kv.kept.cpu(), b.hosted.cpu()])


def _per_query(b: BlockView) -> torch.Tensor:
    """(length,) attention each token received per query that could see it (comparable across blocks)."""
    return b.kv.attention.float() / max(b.kv.observers, 1.0)


def _distance(b: BlockView, active: frozenset[int]) -> int:
    """Tree edges from a block up to the nearest active ancestor (depth + 1 when there is none)."""
    d, node = 0, b.node
    while node is not None and node.id not in active:
        node, d = node.parent, d + 1
    return d
