"""Scorer policies: a policy says how much each token is worth; the base decides what stays.

The tree-blind eviction policies (h2o, streaming, snapkv, kvp) differ only in how they rank tokens,
so, as in kvpress's ``ScorerPress``, each is a :meth:`ScorerPolicy.score` plus its settings, and
:meth:`ScorerPolicy.plan` here is the one top-k. All blocks are one flattened pool in creation
order (:class:`FlatPool`); a plan down to ``cap = max(view.target, 0)`` tokens keeps, in turn:

1. the first ``sinks(cap)`` tokens of the pool (attention sinks; at most ``cap``);
2. the newest ``recent_window(cap)`` tokens (a recent / query window; at most what 1 leaves);
3. the ``cap`` less those with the highest :meth:`~ScorerPolicy.score` among the others
   (``torch.topk``, which also breaks ties).

A pool that already fits gets no plan. Evicted tokens are dropped (or offloaded: a policy's
``Capabilities`` say which); the kept indices of each changed block form the :class:`RetentionPlan`.

Granularity. With ``granularity="token"`` (the default) a kept token keeps its K/V in every layer
and KV head. With ``granularity="head"`` each layer and KV head keeps its own tokens, as the methods
(and kvpress's presses) do: the whole-token plan above still says how many slots each block keeps
(so blocks stay rectangular and the budget in slots is unchanged), then inside each changed block
every (layer, KV head) keeps its top tokens by :meth:`ScorerPolicy.head_scores` (the block's sinks
and recent-window tokens first, whatever their score). For a single block (one compressed context)
that is kvpress's per-head top-k. Scorers that rank by attention read it per layer and KV head
(``BlockKV.head_attention``, recorded only then: ``KVStore.head_stats``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.allocation import flat_pool, head_top_tokens, plan_from_mask
from arbor_runtime.policies.base import MemoryView, Policy, RetentionPlan

#: what ``policy.granularity`` may be: every layer and KV head keeps the same tokens, or each its own
GRANULARITIES = ("token", "head")
#: the memory policies that take ``granularity`` (every one that evicts tokens)
PER_HEAD_POLICIES = ("random", "kvp", "streaming", "h2o", "snapkv", "thinkv", "arbor")


@dataclass(frozen=True, slots=True)
class FlatPool:
    """Every device token of a view's blocks as one sequence: blocks in view (creation) order, each
    block's tokens in ``kv.kept`` (ascending) order; N tokens in all.

    Attributes:
        block: (N,) long index into ``view.blocks``; token: (N,) long block-local index;
        attention: (N,) the attention record of each token (``kv.attention``).
    """

    block: torch.Tensor
    token: torch.Tensor
    attention: torch.Tensor

    @classmethod
    def of(cls, view: MemoryView) -> FlatPool:
        return cls(*flat_pool(view.blocks))

    @property
    def size(self) -> int:
        """N, the tokens in the pool."""
        return int(self.token.numel())


@dataclass(slots=True)
class ScorerPolicy(Policy):
    """A tree-blind policy given by a per-token score (see the module docstring for the plan).

    A subclass implements :meth:`score` and, where it protects tokens whatever their score,
    :meth:`sinks` and :meth:`recent_window`.
    """

    name = "scorer"
    #: ``token``: every layer and KV head keeps the same tokens; ``head``: each keeps its own
    granularity: str = "token"

    def __post_init__(self) -> None:
        Policy.__post_init__(self)
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"{self.name} granularity={self.granularity!r}; valid: {', '.join(GRANULARITIES)}")

    def sinks(self, cap: int) -> int:
        """First tokens of the pool a plan down to ``cap`` tokens keeps whatever their scores."""
        return 0

    def recent_window(self, cap: int) -> int:
        """Newest tokens of the pool a plan down to ``cap`` tokens keeps whatever their scores."""
        return 0

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        """(N,) float scores of the pool's tokens, in ``pool`` order: the higher, the sooner kept.

        Called once by every plan that evicts, after the sinks and the recent window are chosen;
        ``protected`` (N,) bool marks those (kept whatever their score: theirs is ignored).
        """
        raise NotImplementedError

    def head_scores(self, view: MemoryView, block: int, held: torch.Tensor, must: torch.Tensor) -> torch.Tensor:
        """(L, H_kv, K) float scores of the tokens each layer and KV head of ``view.blocks[block]``
        holds (``held``, (L, H_kv, K) block-local tokens, slots in order): the higher, the sooner
        kept. ``must``: the block's protected tokens (kept whatever their score). Called by per-head
        plans only, after :meth:`score`."""
        raise NotImplementedError(f"{self.name} has no per-head scores")

    def plan(self, view: MemoryView) -> RetentionPlan | None:
        pool = FlatPool.of(view)
        n, cap = pool.size, max(view.target, 0)
        if n <= cap:
            return None
        keep = torch.zeros(n, dtype=torch.bool)
        n_sinks = min(self.sinks(cap), cap)
        keep[:n_sinks] = True
        n_recent = min(self.recent_window(cap), cap - n_sinks)
        if n_recent > 0:  # the pool is in creation order: its tail is the newest
            keep[n - n_recent :] = True
        scores = self.score(view, pool, keep.clone())
        n_more = cap - n_sinks - n_recent
        protected = keep.clone()
        if n_more > 0:
            keep[torch.topk(scores.float().masked_fill(keep, float("-inf")), n_more).indices] = True
        plan = RetentionPlan(keep=plan_from_mask(view.blocks, pool.block, pool.token, keep))
        if self.granularity == "head":
            plan.heads = self.per_head(view, pool, protected, plan.keep)
        return plan

    def per_head(
        self, view: MemoryView, pool: FlatPool, protected: torch.Tensor, keep: dict[int, torch.Tensor]
    ) -> dict[int, torch.Tensor]:
        """Per changed block id, (L, H_kv, k) the tokens each layer and KV head keeps: its top ``k``
        (= the block's whole-token count) by :meth:`head_scores`, the block's ``protected`` pool
        tokens (sinks, recent window) first."""
        if view.kv_shape is None:
            raise RuntimeError("a per-head plan needs the model's layers and KV heads: the MemoryView has no kv_shape")
        layers, kv_heads = view.kv_shape
        out = {}
        for i, b in enumerate(view.blocks):
            if b.node.id not in keep:
                continue
            held = b.kv.head_tokens(layers, kv_heads)
            must = pool.token[(pool.block == i) & protected]
            out[b.node.id] = head_top_tokens(
                held, self.head_scores(view, i, held, must), must, int(keep[b.node.id].numel())
            )
        return out
