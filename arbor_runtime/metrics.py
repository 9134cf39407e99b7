"""Run metrics: token counts, memory peaks, timings and a per-step memory trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class TracePoint:
    """Memory after one runtime operation (one search step).

    Attributes:
        step: running operation counter; op: "new_tree" | "expand" | "append" | "release".
        resident_tokens / resident_bytes: device KV after the operation (blocks only).
        peak_tokens: highest resident + working tokens seen during the operation.
        t: seconds since the runtime was created.
        host_tokens: host-tier tokens after the operation; events, rehydrations, branch_switch_events:
            running totals.
        window_dead_bytes: device KV bytes the model's sliding-window layers can no longer read after
            the operation (outside every live node's window; arbor_runtime/kv/windows.py); 0 without windows.
    """

    step: int
    op: str
    resident_tokens: int
    resident_bytes: int
    peak_tokens: int
    t: float
    host_tokens: int = 0
    events: int = 0
    rehydrations: int = 0  # running totals since the runtime was created
    branch_switch_events: int = 0
    window_dead_bytes: int = 0


@dataclass(slots=True)
class RuntimeMetrics:
    """Counters a run records; ``to_dict`` gives a JSON-friendly summary (trace excluded).

    Memory: ``peak_device_tokens`` / ``_bytes`` is the most device KV slots ever in use (retained
    blocks plus the slots admitted to rows in flight); ``pool_bytes`` is what the device pool holds
    (with a budget, exactly the budget). ``preemptions``: rows restarted because a growing row
    needed their slots.

    Token counts: ``prefill_tokens`` are tokens whose KV a prefill computed (prompts, forced
    blocks), ``decode_tokens`` those computed one step at a time (generated blocks). Each token of
    the tree is computed exactly once, so their sum equals the sum of block lengths.
    ``scored_tokens``: tokens ``choose`` forwarded only to score them (choices not kept; no KV).
    """

    prefill_tokens: int = 0
    decode_tokens: int = 0
    scored_tokens: int = 0
    forward_calls: int = 0
    model_seconds: float = 0.0
    runtime_seconds: float = 0.0
    peak_device_tokens: int = 0
    peak_device_bytes: int = 0
    pool_bytes: int = 0
    preemptions: int = 0
    nodes_created: int = 0
    nodes_released: int = 0
    evicted_tokens: int = 0
    dropped_tokens: int = 0
    rehydrations: int = 0
    rehydrated_tokens: int = 0
    recomputed_tokens: int = 0
    peak_host_tokens: int = 0
    peak_host_bytes: int = 0
    bytes_to_host: int = 0
    bytes_to_device: int = 0
    transfer_seconds: float = 0.0
    branch_switch_events: int = 0
    node_end_events: int = 0
    memory_threshold_events: int = 0
    #: sparse decode attention (policy=lychee / quest): index bytes at peak and over the KV they
    #: index, seconds in retrieval, in attention over the chosen chunks, building indexes, and
    #: the share of resident context tokens decode steps read
    peak_index_bytes: int = 0
    index_kv_ratio: float = 0.0
    index_seconds: float = 0.0
    sparse_attention_seconds: float = 0.0
    index_build_seconds: float = 0.0
    sparse_read_fraction: float = 1.0
    #: prefixes shared across trees (``Runtime(share_prefixes=True)``): trees whose root attached
    #: below a stored prefix, prompt tokens they did not prefill, and of those the ones on the
    #: device when they attached (device KV not stored a second time); per account, the trees it made
    prefix_trees: int = 0
    prefix_prefill_saved_tokens: int = 0
    prefix_resident_saved_tokens: int = 0
    #: where waiting goes (issue 23): ``wait_seconds`` sums, over rows and over prefills / choose
    #: passes, the seconds from queued (or preempted) to started; ``turn_wait_seconds`` the seconds a
    #: search had work queued while other searches had the turn (search-level admission);
    #: ``preempted_tokens`` decode tokens thrown away by preemptions (the rows restart);
    #: ``restore_seconds`` making paths whole from the host tier (and ranked restores),
    #: ``evict_seconds`` carrying out the policy's evictions / offloads, ``plan_seconds`` the policy
    #: computing its plans, ``recompute_seconds`` rebuilding blocks dropped from every tier;
    #: ``decode_steps`` / ``decode_step_rows``: decode forwards and the rows in them (``rows_per_step``
    #: in :meth:`to_dict` is their ratio, the average batch)
    wait_seconds: float = 0.0
    turn_wait_seconds: float = 0.0
    preempted_tokens: int = 0
    restore_seconds: float = 0.0
    evict_seconds: float = 0.0
    plan_seconds: float = 0.0
    recompute_seconds: float = 0.0
    decode_steps: int = 0
    decode_step_rows: int = 0
    #: sliding-window models (Mistral, Gemma, gpt-oss): the most device KV bytes, at the end of any
    #: operation, that window layers could no longer read (outside every live node's window). The pool
    #: keeps them (a block's slots hold every layer): it is what a per-layer pool would have freed
    window_dead_bytes_max: int = 0
    #: the most slots one operation needed alone (its whole path plus its slots: a decode row's whole
    #: thought, a prefill's block, a choose pass's kept choices): the least budget at which this
    #: search's every operation fits whole, arbor's floor for it (``MemoryPlanner.lone_need``). Runtime-wide:
    #: a search's account (``Account.metrics``) leaves it 0, as several searches may share the runtime
    floor_tokens: int = 0
    trace: list[TracePoint] = field(default_factory=list)

    @property
    def overhead_seconds(self) -> float:
        """Time inside runtime calls but outside model forwards."""
        return max(0.0, self.runtime_seconds - self.model_seconds)

    @property
    def rows_per_step(self) -> float:
        """Average rows per decode forward (0 when nothing decoded)."""
        return self.decode_step_rows / self.decode_steps if self.decode_steps else 0.0

    def note_peak(self, tokens: int, bytes_per_token: int) -> None:
        if tokens > self.peak_device_tokens:
            self.peak_device_tokens = tokens
            self.peak_device_bytes = tokens * bytes_per_token

    def sync_store(self, store, events) -> None:
        """Copy the store's movement counters and the event counts (totals since creation)."""
        c = store.counters
        for name in (
            "evicted_tokens", "dropped_tokens", "rehydrations", "rehydrated_tokens",
            "recomputed_tokens", "peak_host_tokens", "peak_host_bytes",
        ):  # fmt: skip
            setattr(self, name, getattr(c, name))
        host = store.host
        self.bytes_to_host, self.bytes_to_device, self.transfer_seconds = (
            host.bytes_to_host,
            host.bytes_to_device,
            host.transfer_seconds,
        )
        self.sync_events(events)

    def sync_sparse(self, stats) -> None:
        """Copy a runtime's :class:`~arbor_runtime.sparse.SparseStats` totals."""
        self.peak_index_bytes, self.index_kv_ratio = stats.peak_index_bytes, stats.index_ratio
        self.index_seconds, self.index_build_seconds = stats.index_seconds, stats.build_seconds
        self.sparse_attention_seconds, self.sparse_read_fraction = stats.attention_seconds, stats.read_fraction

    def add_store_delta(self, before: dict[str, float], after: dict[str, float]) -> None:
        """Add what the store moved between two :func:`store_totals` snapshots (an account's share)."""
        for name in STORE_FIELDS:
            setattr(self, name, getattr(self, name) + after[name] - before[name])
        if after["host_tokens"] > self.peak_host_tokens:
            self.peak_host_tokens, self.peak_host_bytes = int(after["host_tokens"]), int(after["host_bytes"])

    def sync_events(self, events) -> None:
        """Event counts from an event log (an account's own)."""
        counts = events.counts()
        self.branch_switch_events = counts.get("branch_switch", 0)
        self.node_end_events = counts.get("node_end", 0)
        self.memory_threshold_events = counts.get("memory_threshold", 0)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "trace"}
        out["overhead_seconds"] = self.overhead_seconds
        out["rows_per_step"] = round(self.rows_per_step, 3)
        return out


#: store movement counters an account adds up as deltas (see :func:`store_totals`)
STORE_FIELDS = (
    "evicted_tokens", "dropped_tokens", "rehydrations", "rehydrated_tokens", "recomputed_tokens",
    "bytes_to_host", "bytes_to_device", "transfer_seconds",
)  # fmt: skip


#: memory manager timings (``MemoryManager.seconds`` keys) and the metrics fields they go to
MEMORY_SECONDS = {"plan": "plan_seconds", "evict": "evict_seconds", "restore": "restore_seconds"}


def store_totals(store) -> dict[str, float]:
    """The store's running movement totals and its host-tier size now."""
    c, host = store.counters, store.host
    out = {name: getattr(c, name) for name in STORE_FIELDS[:5]}
    out |= {"bytes_to_host": host.bytes_to_host, "bytes_to_device": host.bytes_to_device}
    out |= {"transfer_seconds": host.transfer_seconds, "host_tokens": store.host_tokens}
    out["host_bytes"] = store.host_tokens * store.shape.bytes_per_token
    return out
