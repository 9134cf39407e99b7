"""Memory policy interface.

A policy reacts to events (node end, branch switch, memory threshold) and answers with a
:class:`RetentionPlan`: for some blocks, the token indices that stay on the device. The store
carries plans out (offloading to the host tier or dropping, by the policy's ``offload``); a
policy never moves tensors itself. Policies read the tree and per-block statistics through a
:class:`MemoryView` the runtime builds for each event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch

from arbor_runtime.events import Event, MemoryThreshold
from arbor_runtime.kv.block import BlockKV
from arbor_runtime.tree import Node

NO_TOKENS = torch.zeros(0, dtype=torch.long)  # a block's ``hosted`` when none of it is on the host (read only)


#: what the planner may pin of a path below the floor, in the order it pins them as room allows
PIN_PARTS = ("sinks", "frontier", "question", "parent")


@dataclass(frozen=True, slots=True)
class BlockView:
    """A live block as a policy sees it: its node (text, value, entropies, depth) and its KV record.

    ``hosted``: (H,) block-local indices of its tokens on the host tier (empty: none); a plan below
    the floor may keep them (they come back).
    """

    node: Node
    kv: BlockKV
    active: bool
    hosted: torch.Tensor = NO_TOKENS


class LazyBlocks(Sequence):
    """A view's blocks, built on first use: most events (a node's end, a branch switch) leave the policy
    nothing to plan, and building a :class:`BlockView` of every live block for them would cost time in
    proportion to the whole tree on every one. ``build()`` returns the list."""

    __slots__ = ("_build", "_blocks")

    def __init__(self, build: Callable[[], list[BlockView]]) -> None:
        self._build, self._blocks = build, None

    def _list(self) -> list[BlockView]:
        if self._blocks is None:
            self._blocks = self._build()
        return self._blocks

    def __getitem__(self, index):
        return self._list()[index]

    def __len__(self) -> int:
        return len(self._list())

    def __iter__(self) -> Iterator[BlockView]:
        return iter(self._list())


@dataclass(frozen=True, slots=True)
class MemoryView:
    """What a policy may read when it plans.

    Attributes:
        blocks: live blocks in creation order (oldest first); shared prefix blocks first, by position.
        active: node ids on the active paths (the nodes about to be / just expanded and ancestors).
        budget: ``budget_tokens``; target: resident block tokens the plan should get down to.
        read: ``read(block_id, tokens)`` -> copies of the K/V of a block's device ``tokens`` (N,),
            (L, H_kv, N, D) each, for policies that score tokens by their K/V (None: unavailable).
        pinned: None at and above the floor (active blocks stay whole). Below the floor (the active
            path plus the rows' new tokens do not fit whole; decided by the planner), block id ->
            block-local tokens of the active path that stay whatever their value; every other
            token of the active path, on the device or on the host, may then be kept or not: the
            plan's ``keep`` of an active block is its whole residency (host tokens in it come back).
        kv_shape: (L, H_kv), the model's layers and KV heads (for per-head plans; None: unknown).
    """

    blocks: Sequence[BlockView]  # a list, or the runtime's LazyBlocks (built on first use)
    active: frozenset[int]
    budget: int | None
    target: int
    read: Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    pinned: Mapping[int, torch.Tensor] | None = None
    kv_shape: tuple[int, int] | None = None

    @property
    def resident(self) -> int:
        return sum(b.kv.kept_tokens for b in self.blocks)


@dataclass(slots=True)
class RetentionPlan:
    """Per block id, the sorted block-local token indices to keep on the device (others leave).

    ``host_order``: under a host cap, blocks in the order their host-tier spans may be forgotten
    (lowest value first; None: the policy ranks none). The planner decides how many go
    (:meth:`~arbor_runtime.planner.MemoryPlanner.host_drops`) and lists them in ``drop_host``.

    ``heads``: per-(layer, KV head) retention (``policy.granularity=head``): block id -> (L, H_kv, k)
    the tokens each layer and KV head keeps, ``k`` = that block's ``keep`` count (``keep`` is then
    the nominal token set the planner counts; :meth:`~arbor_runtime.kv.store.KVStore.apply_heads`).
    """

    keep: dict[int, torch.Tensor] = field(default_factory=dict)
    drop_host: list[int] = field(default_factory=list)
    host_order: list[int] | None = None
    heads: dict[int, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keep) + len(self.drop_host)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a policy asks of the runtime, declared once and read by the memory planner alone
    (:class:`~arbor_runtime.planner.MemoryPlanner`): every decision that depends on a policy's kind is
    the planner's, the rest of the runtime asks it. A sparse wrapper declares its own from the
    policy it wraps.

    Attributes:
        offload: evicted tokens go to the host tier (True) or are gone for good (False).
        keep_active_whole: the active path is never evicted from; the runtime restores (rehydrates
            / recomputes) it before each expansion.
        needs_attention: the runtime records attention statistics for this policy.
        frees_memory: the policy's plans can free device memory (full's cannot: over budget is an OOM).
        observation_window: when set (W), attention statistics come only from an observation window:
            the last W queries of each prefilled block (prompt, forced block, prefill chunk), which
            replace the earlier record of every token they see; decode queries are not counted (SnapKV).
        restores_active_path: the runtime makes the active path whole (rehydrate / recompute) before
            each expansion. Default (None): ``keep_active_whole``; a sparse wrapper that brings the
            path's evicted spans back on demand (``rehydrate=ranked``) says False.
        shrinks_active_path: the policy may evict from the active path itself (tree-blind policies):
            a prompt larger than the budget is then prefilled in chunks, evicting between them.
            Default (None): ``frees_memory and not keep_active_whole``.
        degrades: below its floor (a lone row's active path plus its new tokens do not fit whole)
            a policy that keeps the active path whole keeps running instead of refusing: the planner
            pins the root's ``sink_tokens``, the frontier block, the prompt outside its few-shot
            examples and the frontier's parent (each as room allows, in that order) and the policy's plan
            keeps the rest of the path by value, on the device or brought back from the host
            (``MemoryView.pinned``); a prompt larger than the budget is prefilled in chunks.
        sink_tokens: first tokens of each root pinned below the floor (with ``degrades``).
        pins: which of :data:`PIN_PARTS` the planner pins below the floor (with ``degrades``); arbor's
            ``policy.pins`` takes some away to measure what each is worth (the frontier always stays).
        stats_on_pressure: the policy's plans need attention statistics only once memory is short:
            a forward records them only when resident KV is within reach of the threshold (the
            planner's :meth:`~arbor_runtime.planner.MemoryPlanner.records_statistics`), never without a
            budget. False: every forward records them (``needs_attention``; the tree-blind scorers
            rank by the whole history).
    """

    offload: bool = False
    keep_active_whole: bool = False
    needs_attention: bool = False
    frees_memory: bool = True
    observation_window: int | None = None
    restores_active_path: bool | None = None
    shrinks_active_path: bool | None = None
    degrades: bool = False
    sink_tokens: int = 0
    pins: frozenset[str] = frozenset(PIN_PARTS)
    stats_on_pressure: bool = False

    def __post_init__(self) -> None:
        if self.restores_active_path is None:
            object.__setattr__(self, "restores_active_path", self.keep_active_whole)
        if self.shrinks_active_path is None:
            object.__setattr__(self, "shrinks_active_path", self.frees_memory and not self.keep_active_whole)


@dataclass(slots=True)
class Policy:
    """Base policy: ``plan`` says what stays; it declares its :attr:`capabilities`.

    The memory settings are given with the policy (``policy.budget_tokens=...`` on the command line,
    ``ArborPolicy(budget_tokens=...)`` in Python) and validated here; the runtime reads them once into
    the planner's :class:`~arbor_runtime.planner.MemoryConfig`, and nothing reads them back from the
    policy (a plan sees ``MemoryView.budget`` and ``target``).

    Attributes:
        budget_tokens: cap on resident device KV tokens (blocks + working buffers); None = no cap.
        threshold: a MemoryThreshold event fires when resident blocks pass ``threshold * budget``
            after an operation; the plan then aims at that level.
        prefill_chunk: tokens per chunk when a block larger than the room left is prefilled in
            chunks, evicting between them (policies that may shrink the active path only);
            None = a quarter of the budget.
    """

    name = "base"
    #: what this kind of policy asks of the runtime; a subclass declares its own (or, where it
    #: depends on the policy's fields, overrides :attr:`capabilities`)
    CAPABILITIES: ClassVar[Capabilities] = Capabilities()

    budget_tokens: int | None = None
    threshold: float = 0.9
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        if self.budget_tokens is not None and (not isinstance(self.budget_tokens, int) or self.budget_tokens <= 0):
            raise ValueError(f"budget_tokens={self.budget_tokens} must be a positive number of tokens or None")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold} must be in (0, 1]")
        if self.prefill_chunk is not None and (not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 1):
            raise ValueError(f"prefill_chunk={self.prefill_chunk} must be a positive number of tokens or None")

    @property
    def capabilities(self) -> Capabilities:
        """What this policy asks of the runtime (read by the planner alone)."""
        return self.CAPABILITIES

    @property
    def kv_budget_tokens(self) -> int | None:
        """Device pool slots for K/V: the budget, less what the policy reserves for itself (a
        sparse attention index, counted in pool-equivalent tokens)."""
        return self.budget_tokens

    def sparse_attention(self, store, token_ids, decode):
        """The sparse decode attention this policy reads with (``arbor_runtime.sparse``); None = dense.

        Args:
            store: the runtime's block store; token_ids: block id -> its token ids;
            decode: token ids -> text (a tokenizer's ``decode``), None without text.
        """
        return None

    def split_block(self, block_id: int, prefix_id: int, at: int) -> None:
        """A block was cut in two (a prefix shared across trees, ``arbor_runtime.prefix``): its tokens
        [0, at) are block ``prefix_id`` now, the rest stay ``block_id`` numbered from 0.

        Per-block state must be cut the same way. The default does it for the usual shapes: every
        field holding a dict keyed by block id has that entry's per-token tensors cut on their last
        dim (:func:`split_tokens`), and every field with a ``split_block`` of its own (a scorer's
        cache) is told. A policy keeping state otherwise overrides this.
        """
        for f in fields(self):
            value = getattr(self, f.name, None)
            if isinstance(value, dict):
                split_tokens(value, block_id, prefix_id, at)
            elif callable(getattr(value, "split_block", None)):
                value.split_block(block_id, prefix_id, at)

    def on_event(self, event: Event, view: MemoryView) -> RetentionPlan | None:
        """React to an event; the default plans only on memory pressure (below the floor always: the
        plan also says which host tokens of the active path come back)."""
        if isinstance(event, MemoryThreshold) and (view.resident > view.target or view.pinned is not None):
            return self.plan(view)
        return None

    def plan(self, view: MemoryView) -> RetentionPlan | None:
        """Which tokens stay so that resident blocks fit ``view.target``; None keeps everything."""
        return None


def split_tokens(state: dict, block_id: int, prefix_id: int, at: int) -> None:
    """Cut ``state[block_id]`` (a per-token tensor (..., T), or a tuple of them) at token ``at``:
    the first part goes to ``prefix_id``, the rest stays. Other values are left alone."""
    value = state.get(block_id)
    parts = value if isinstance(value, tuple) else (value,)
    if not parts or not all(isinstance(p, torch.Tensor) and p.dim() >= 1 for p in parts):
        return
    head = tuple(p[..., :at].clone() for p in parts)
    tail = tuple(p[..., at:].clone() for p in parts)
    state[prefix_id] = head if isinstance(value, tuple) else head[0]
    state[block_id] = tail if isinstance(value, tuple) else tail[0]
