"""Sparse decode attention over a memory policy: the base of ``lychee`` and ``quest``.

Two questions, two objects. A memory policy (full, h2o, streaming, thinkv, arbor) decides what
is resident on the device; a sparse policy decides what a decode query *reads* of what is
resident. A sparse policy wraps a memory policy: every memory event, plan and knob goes to the
wrapped policy, and the wrapper adds the attention index. So ``policy=lychee policy.memory=arbor``
is arbor's residency (active path whole, evicted spans on the host) with LycheeCluster reads;
``policy=lychee`` alone is lychee over ``full``.

The index's memory counts in ``budget_tokens``: the wrapper reserves ``index_reserve`` of the
budget for it, in pool-equivalent tokens (``reserve_tokens``); the device pool, and the memory
policy's budget, get the rest (``kv_budget_tokens``), so pool plus index never pass the budget.
A block whose index would not fit the reserve is read whole.

Rehydration (``rehydrate``) under a memory policy that keeps the active path whole and offloads
evicted spans to the host (arbor): ``whole`` makes the path whole before each expansion, as the
memory policy does alone; ``ranked`` does not: a row starts with what is resident, and after each
decode step the evicted chunks its queries' retrieval would have read come back first (the chunks
ranked by how many layers, heads and rows wanted them), into free room, leaving room for the rows'
growth. The path still is never evicted from while active; the device then holds what decoding
reads rather than the whole path, so a search runs at budgets below its longest path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from arbor_runtime.events import Event
from arbor_runtime.policies.base import Capabilities, MemoryView, Policy, RetentionPlan
from arbor_runtime.policies.registry import MEMORY_POLICIES
from arbor_runtime.sparse import SelectConfig, SparseAttention
from arbor_runtime.sparse.calibrated import dense_layers_for
from arbor_runtime.sparse.reads import AUTO, BudgetedAttention, dense_layer_set, dense_layers_builder

#: how the active path's evicted spans come back (see the module docstring)
REHYDRATE = ("whole", "ranked")


@dataclass(slots=True)
class SparsePolicy(Policy):
    """Decode attention over retrieved chunks of a memory policy's resident KV (prefill stays dense).

    Attributes:
        memory: the memory policy, a name (``full``, ``h2o``, ``streaming``, ``snapkv``, ``thinkv``, ``arbor``, ``kvp``)
            or a built policy (its budget is replaced by ``kv_budget_tokens``).
        memory_args: the named memory policy's own knobs (e.g. ``{"distance_decay": 0.5}``).
        token_budget: resident context tokens each decode query reads per KV head (sinks and window
            included; the row's own tokens come on top); with ``token_share`` the floor (512).
        token_share: read max(token_budget, token_share x the row's resident context) tokens
            (at most the context; 0 = ``token_budget`` alone). See ``arbor_runtime/sparse/reads.py``.
        dense_below: decode steps whose longest row holds fewer resident context tokens than this are
            attended dense (no index is built or read). 6,144 by default: on SmolLM2 on one CPU
            thread, at 2K and 4K no read share of the RULER-style suite kept 95% of dense's correct
            answers while decoding over 1.05x dense's speed; at 8K the defaults are sparse (issue 49,
            docs/data/longctx/).
        dense_layers: layers that read every resident token: an int n, the first n (0 = none), a
            list of layer indices (``[7]``: on SmolLM2 the layer whose sparse reads alone drop the last
            digit of a copied number, issue 49), or ``"auto"``: the layers measured for the model
            (:mod:`arbor_runtime.sparse.calibrated`, by weights fingerprint; none for a model not listed),
            resolved when the runtime binds the policy to its model.
        sink_tokens / window_tokens: first and last positions always read.
        min_block_tokens: blocks shorter than this are read whole (not indexed).
        exact: exact top-k retrieval by bound (slower; lychee only, quest's flat scan is exact).
        bound_scale: how a chunk is scored, in [0, 1]: 1 its upper bound of q.k (lychee's q.c + |q| r,
            quest's per-channel min / max), below 1 the bound's spread term scaled down (lychee
            q.c + a |q| r, quest q.m + a sum |q_d| h_d); 0 (the default) the centroid (range middle)
            alone. The bound over-ranks wide chunks: at 10-50% reads the first answer token's KL to
            dense is 1.1-2x lower with 0 (issue 24, rows in docs/data/longctx/).
        rerank: 0 (off) or a factor >= 1: the chunks are selected up to ``rerank`` times the read
            budget (the candidates), every candidate key is scored exactly (max over the KV head's
            query heads of q.k, the attention's own scores) and the budget's best keys are read: a
            token-exact cut over a chunk-sized search, for a second key gather and a top-k per layer.
        index_reserve: share of ``budget_tokens`` reserved for the index (with a budget).
        rehydrate: ``whole`` (the memory policy makes the active path whole before expanding it) or
            ``ranked`` (evicted spans of the active path come back on demand, in index order;
            needs a memory policy with a host tier that keeps the active path: arbor).
        inner: the built memory policy (not a constructor argument).
    """

    name = "sparse"

    memory: Any = "full"
    memory_args: dict[str, Any] = field(default_factory=dict)
    token_budget: int = 512
    token_share: float = 0.5
    dense_below: int = 6144
    dense_layers: int | list[int] | str = 0
    sink_tokens: int = 16
    window_tokens: int = 64
    min_block_tokens: int = 64
    exact: bool = False
    bound_scale: float = 0.0
    rerank: float = 0.0
    index_reserve: float = 0.03
    rehydrate: str = "whole"
    inner: Policy = field(init=False, repr=False)
    #: ``dense_layers="auto"`` resolved for the bound model (:meth:`bind`); None before
    model_dense_layers: list[int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.memory, Policy) and self.budget_tokens is None:
            self.budget_tokens = self.memory.budget_tokens
        Policy.__post_init__(self)
        knobs = ("token_budget", 1), ("sink_tokens", 0), ("window_tokens", 0), ("min_block_tokens", 0)
        for knob, least in (*knobs, ("dense_below", 0)):
            value = getattr(self, knob)
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{knob}={value!r} must be an integer >= {least}")
        if self.dense_layers != AUTO:
            picked = dense_layer_set(self.dense_layers)  # ValueError naming a bad value
            if not isinstance(self.dense_layers, int):  # a list (Hydra's ListConfig too): plain ints, in order
                self.dense_layers = sorted(picked)
        if (
            isinstance(self.token_share, bool)
            or not isinstance(self.token_share, int | float)
            or not (0.0 <= self.token_share <= 1.0)
        ):
            raise ValueError(f"token_share={self.token_share!r} must be a number in [0, 1]")
        if (
            isinstance(self.bound_scale, bool)
            or not isinstance(self.bound_scale, int | float)
            or not (0.0 <= self.bound_scale <= 1.0)
        ):
            raise ValueError(f"bound_scale={self.bound_scale!r} must be a number in [0, 1]")
        if (
            isinstance(self.rerank, bool)
            or not isinstance(self.rerank, int | float)
            or not (self.rerank == 0 or 1.0 <= self.rerank <= 64.0)
        ):
            raise ValueError(f"rerank={self.rerank!r} must be 0 (off) or a number in [1, 64]")
        if not 0.0 <= self.index_reserve < 0.5:
            raise ValueError(f"index_reserve={self.index_reserve} must be in [0, 0.5)")
        if not isinstance(self.exact, bool):
            raise ValueError(f"exact={self.exact!r} must be True or False")
        if self.budget_tokens is not None and self.kv_budget_tokens < 1:
            raise ValueError(f"budget_tokens={self.budget_tokens} leaves no pool slot after the index reserve")
        self.inner = self._build_memory()
        if getattr(self.inner, "granularity", "token") != "token":
            raise ValueError(
                f"{self.name}: memory={self.inner.name!r} with granularity={self.inner.granularity!r}: a sparse "
                "read ranks whole tokens; valid: granularity=token"
            )
        self.prefill_chunk = self.inner.prefill_chunk  # the memory policy prefills (its own, when built)
        if self.rehydrate not in REHYDRATE:
            raise ValueError(f"rehydrate={self.rehydrate!r}; valid: {', '.join(REHYDRATE)}")
        inner = self.inner.capabilities
        if self.rehydrate == "ranked" and not (inner.offload and inner.keep_active_whole):
            msg = (
                f"rehydrate=ranked needs a memory policy that offloads evicted spans and keeps the active"
                f" path (arbor), not memory={self.inner.name!r}"
            )
            raise ValueError(msg)

    def _build_memory(self) -> Policy:
        if isinstance(self.memory, SparsePolicy):
            raise ValueError(f"memory={self.memory.name!r} is a sparse policy; valid: {', '.join(MEMORY_POLICIES)}")
        if isinstance(self.memory, Policy):
            return replace(self.memory, budget_tokens=self.kv_budget_tokens)
        cls = MEMORY_POLICIES.get(str(self.memory))
        if cls is None:
            raise ValueError(f"memory={self.memory!r} is not a memory policy; valid: {', '.join(MEMORY_POLICIES)}")
        args = {"threshold": self.threshold, "prefill_chunk": self.prefill_chunk} | dict(self.memory_args)
        return cls(budget_tokens=self.kv_budget_tokens, **args)

    # ---- budget --------------------------------------------------------------------------------
    @property
    def reserve_tokens(self) -> int:
        """Pool-equivalent tokens of the budget reserved for the index (0 without a budget)."""
        if self.budget_tokens is None:
            return 0
        return math.ceil(self.index_reserve * self.budget_tokens)

    @property
    def kv_budget_tokens(self) -> int | None:
        return None if self.budget_tokens is None else self.budget_tokens - self.reserve_tokens

    # ---- the memory policy decides residency ---------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """The memory policy's, except that ``rehydrate=ranked`` brings the active path back on demand
        (and so has no floor to go below: it already runs with part of the path resident)."""
        inner = self.inner.capabilities
        whole = self.rehydrate == "whole"
        restores = inner.restores_active_path and whole
        return replace(inner, restores_active_path=restores, degrades=inner.degrades and whole)

    @property
    def host_budget_tokens(self) -> int | None:
        return getattr(self.inner, "host_budget_tokens", None)

    @property
    def vocab_size(self) -> int | None:
        return getattr(self.inner, "vocab_size", None)

    @vocab_size.setter
    def vocab_size(self, value: int) -> None:
        if hasattr(self.inner, "vocab_size"):
            self.inner.vocab_size = value

    def _dense_layers(self) -> int | list[int]:
        """``dense_layers`` with ``"auto"`` resolved; ValueError when it was never bound to a model."""
        if self.dense_layers != AUTO:
            return self.dense_layers
        if self.model_dense_layers is None:
            raise ValueError(
                "dense_layers='auto' reads the layers measured for the model (arbor_runtime/sparse/calibrated.py): "
                "build the policy through Runtime, or call policy.bind(model) first"
            )
        return self.model_dense_layers

    def bind(self, model) -> None:
        """Hand the model to a memory policy that reads it (kvp: its weights by model fingerprint), and
        resolve ``dense_layers="auto"`` to the layers measured for it."""
        if self.dense_layers == AUTO:
            self.model_dense_layers = dense_layers_for(model)
        bind = getattr(self.inner, "bind", None)
        if bind is not None:
            bind(model)

    def on_event(self, event: Event, view: MemoryView) -> RetentionPlan | None:
        return self.inner.on_event(event, view)

    def plan(self, view: MemoryView) -> RetentionPlan | None:
        return self.inner.plan(view)

    # ---- the wrapper decides reads ---------------------------------------------------------------
    def index_builder(self):
        """(builder, chunk width) of this method's block index; subclasses implement it."""
        raise NotImplementedError

    def sparse_attention(self, store, token_ids, decode):
        device = store.shape.device
        if device.type != "cpu":  # the index tensors are built on the host (README: sparse decode attention)
            valid = ", ".join(MEMORY_POLICIES)
            msg = f"policy={self.name}: sparse indexes need a CPU model, not {device}; valid: {valid}"
            raise NotImplementedError(msg)
        builder, width = self.index_builder()
        whole, layers = dense_layer_set(self._dense_layers()), store.shape.layers
        if any(i >= layers for i in whole):
            raise ValueError(f"dense_layers={self.dense_layers!r}: the model has layers 0..{layers - 1}")
        builder = dense_layers_builder(builder, whole)
        select = SelectConfig(
            token_budget=self.token_budget,
            sink_tokens=self.sink_tokens,
            window_tokens=self.window_tokens,
            min_block_tokens=self.min_block_tokens,
            exact=self.exact,
            width=width,
            dense_below=self.dense_below,
            rerank=float(self.rerank),
        )
        reserve = None if self.budget_tokens is None else self.reserve_tokens * store.shape.bytes_per_token
        on_demand = self.rehydrate == "ranked"
        if self.token_share > 0:
            share = self.token_share
            made = BudgetedAttention(builder, select, store, token_ids, decode, reserve, on_demand, share=share)
        else:
            made = SparseAttention(builder, select, store, token_ids, decode, reserve, on_demand)
        made.whole_layers = whole
        return made
