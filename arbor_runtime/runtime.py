"""The public runtime: a search tree whose KV is kept once per thought block.

Controllers call ``new_tree``, ``expand``/``expand_many``, ``append``, ``set_value`` and
``release``; the runtime gathers each path's KV from the store, runs the backend, stores new
blocks, and lets the memory manager turn each operation into policy events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from arbor_runtime.attention import AttentionRecorder
from arbor_runtime.backend import BatchCache, ModelBackend
from arbor_runtime.errors import BudgetError
from arbor_runtime.generation import Row, StopChecker, decode_rows, sample_into
from arbor_runtime.kv import BlockKV, KVStore
from arbor_runtime.loading import LoadedModel
from arbor_runtime.memory import MemoryManager
from arbor_runtime.metrics import RuntimeMetrics, TracePoint
from arbor_runtime.policies import Policy, build_policy
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import FORCED, GENERATED, PROMPT, Node

log = logging.getLogger(__name__)

#: decode tokens per row the memory manager makes room for at a time (like a KV page): room for
#: the first DECODE_AHEAD tokens of every row before an expansion, then more as rows grow
DECODE_AHEAD = 8


class Runtime:
    """Tree-structured generation over one model with per-block KV reuse.

    Args:
        loaded: model and tokenizer from :func:`arbor_runtime.load_model`.
        policy: a policy name (``"full"``, ``"arbor"``, ...) or a built :class:`Policy`.
        budget_tokens: cap on resident device KV tokens (used when ``policy`` is a name).
        seed: seeds the runtime's sampling generator.
    """

    def __init__(
        self, loaded: LoadedModel, policy: str | Policy = "full", budget_tokens: int | None = None, seed: int = 0
    ) -> None:
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.policy = build_policy(policy, budget_tokens=budget_tokens)
        if hasattr(self.policy, "vocab_size"):
            self.policy.vocab_size = int(self.model.config.vocab_size)
        self.backend = ModelBackend(self.model)
        self.store = KVStore(self.backend.shape)
        self.metrics = RuntimeMetrics()
        self.nodes: dict[int, Node] = {}  # live nodes
        self.all_nodes: dict[int, Node] = {}  # every node ever created, released ones too
        #: public operations in call order (JSON-friendly), for trace recording and replay
        self.oplog: list[dict] = []
        #: called with (node, (T, V) log-probs) for every forced block; used by trace replay
        self.logits_hook: Callable[[Node, torch.Tensor], None] | None = None
        self.memory = MemoryManager(self.store, self.policy, self.nodes, self._recompute)
        self._next_id = 0
        self._gen = torch.Generator().manual_seed(seed)
        self._eos_ids = _eos_ids(loaded)
        self._t0 = time.perf_counter()

    # ---- public API ----------------------------------------------------------------------
    @property
    def budget_tokens(self) -> int | None:
        return self.policy.budget_tokens

    @property
    def events(self):
        """The :class:`~arbor_runtime.events.EventLog` of this runtime."""
        return self.memory.events

    def new_tree(self, prompt: str) -> Node:
        """Start a tree whose root block is ``prompt`` (prefilled once)."""
        return self.new_tree_ids(self.tokenizer(prompt, add_special_tokens=True)["input_ids"], prompt)

    def new_tree_ids(self, ids: Sequence[int], text: str | None = None) -> Node:
        """Start a tree whose root block is exactly these token ids (trace replay uses this)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("prompt is empty: a root block needs at least one token")
        budget = self.budget_tokens
        if budget is not None and len(ids) > budget:
            raise BudgetError(
                f"budget_tokens={budget} is smaller than the root prompt ({len(ids)} tokens): "
                "the active path could never fit; raise the budget"
            )
        text = self.tokenizer.decode(ids) if text is None else text
        with self._op("new_tree"):
            node = self._new_node(None, ids, text, PROMPT, start_pos=0)
            self.memory.prepare([], len(ids))
            self._prefill(node, with_logprobs=False)
            self.memory.after([], [node])
        self.oplog.append({"op": "new_tree", "node": node.id, "ids": list(ids)})
        return node

    def expand(self, node: Node, n: int = 1, sampling: SamplingParams | None = None) -> list[Node]:
        """Sample ``n`` child thoughts of ``node`` as one batch; returns the children."""
        return self.expand_many([(node, n)], sampling)[0]

    def expand_many(
        self, requests: Sequence[tuple[Node, int]], sampling: SamplingParams | None = None
    ) -> list[list[Node]]:
        """Sample children for several nodes (any depths) in one batch.

        Args:
            requests: (node, n) pairs; rows of different context lengths are right-padded.
        Returns:
            one list of children per request, in request order.
        """
        params = sampling or SamplingParams()
        self._check_requests(requests)
        targets = [node for node, _ in requests]
        with self._op("expand"):
            rows = sum(n for _, n in requests)
            self.memory.prepare(targets, rows * min(params.max_new_tokens, DECODE_AHEAD))
            out = self._expand(requests, params)
            self.memory.after(targets, [c for kids in out for c in kids])
        self.oplog.append(
            {
                "op": "expand",
                "requests": [[n.id, k] for n, k in requests],
                "children": [[c.id for c in kids] for kids in out],
            }
        )
        return out

    def append(self, node: Node, text: str) -> Node:
        """Add a teacher-forced child block holding ``text``; its ``logprobs`` score the text."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"append text {text!r} tokenizes to nothing")
        return self.append_ids(node, ids, text)

    def append_ids(self, node: Node, ids: Sequence[int], text: str | None = None) -> Node:
        """Add a teacher-forced child block of exactly these token ids (trace replay uses this)."""
        self._check_live(node)
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("append_ids needs at least one token id")
        text = self.tokenizer.decode(ids) if text is None else text
        with self._op("append"):
            self.memory.prepare([node], len(ids))
            child = self._new_node(node, ids, text, FORCED, start_pos=node.end_pos)
            self._prefill(child, with_logprobs=True)
            self.memory.after([node], [child], forced=True)
        self.oplog.append({"op": "append", "node": node.id, "child": child.id, "ids": ids})
        return child

    def set_value(self, node: Node, value: float) -> None:
        """Record the search value a verifier gave ``node`` (MSVE reads it)."""
        node.value = float(value)
        self.oplog.append({"op": "set_value", "node": node.id, "value": node.value})

    def release(self, node: Node) -> None:
        """Drop ``node``'s subtree and its KV from every tier; the node stays readable."""
        with self._op("release"):
            gone = []
            for sub in list(node.subtree()):
                if sub.id in self.store:
                    self.store.pop(sub.id)
                sub.released = True
                self.nodes.pop(sub.id, None)
                gone.append(sub.id)
                self.metrics.nodes_released += 1
            self.memory.forget(gone)
            if node.parent is not None and node in node.parent.children:
                node.parent.children.remove(node)
        self.oplog.append({"op": "release", "node": node.id})

    def path_token_ids(self, node: Node) -> list[int]:
        """Token ids from the root to ``node`` inclusive (the flattened text's ids)."""
        return [t for n in node.path() for t in n.token_ids]

    def path_text(self, node: Node) -> str:
        return "".join(n.text for n in node.path())

    def next_token_logprobs(self, node: Node) -> torch.Tensor:
        """(V,) log-probabilities of the token after ``node``'s path."""
        return torch.log_softmax(self.store.get(node.id).next_logits, dim=-1)

    def residency(self, node: Node) -> dict[str, int]:
        """Where ``node``'s block lives: tokens on device, on host, dropped."""
        if node.id not in self.store:
            return {"device": 0, "host": 0, "dropped": node.length}
        blk = self.store.get(node.id)
        host = self.store.host.indices(node.id)
        n_host = 0 if host is None else int(host.numel())
        return {"device": blk.kept_tokens, "host": n_host, "dropped": blk.length - blk.kept_tokens - n_host}

    # ---- internals: prefill --------------------------------------------------------------
    def _prefill(self, node: Node, with_logprobs: bool) -> None:
        """Compute ``node``'s block KV over its ancestors' KV (its tokens are new)."""
        batch, logits = self._run_prefill(node, logits_to_keep=0 if with_logprobs else 1, record=True)
        if with_logprobs:
            self._score_forced(node, logits)
        keys, values = batch.cache.extract(0, 0, node.length)
        self.store.put(node.id, BlockKV.full(keys, values, node.start_pos, logits[-1].float().cpu().clone()))
        self._take_attention(batch, node, 0)
        self.metrics.prefill_tokens += node.length

    def _recompute(self, node: Node) -> None:
        """Rebuild a block dropped from every tier by prefilling it over its (whole) ancestors."""
        batch, _ = self._run_prefill(node, logits_to_keep=1, record=False)
        self.store.replace_whole(node.id, *batch.cache.extract(0, 0, node.length))

    def _run_prefill(self, node: Node, logits_to_keep: int, record: bool) -> tuple[_Batch, torch.Tensor]:
        """One forward of ``node``'s tokens over its parent's path. Returns the batch and (T', V) logits."""
        self.memory.reserve(node.length, "prefill")
        context = self._context(node.parent)
        batch = self._new_batch([context], node.length, record)
        positions = torch.arange(node.start_pos, node.end_pos).unsqueeze(0)
        logits = self.backend.forward(
            batch.cache, torch.tensor([node.token_ids]), positions, logits_to_keep, batch.recorder
        )
        return batch, logits[0]

    def _score_forced(self, node: Node, logits: torch.Tensor) -> None:
        """Fill logprobs/entropies of a forced block. logits: (T, V), row i predicts token i+1."""
        prev = self.store.get(node.parent.id).next_logits.to(logits.device)
        dists = torch.cat([prev.unsqueeze(0), logits[:-1].float()], dim=0)  # (T, V) predicting each token
        logp = torch.log_softmax(dists, dim=-1)
        tokens = torch.tensor(node.token_ids, device=logits.device)
        node.logprobs = logp.gather(-1, tokens.view(-1, 1)).squeeze(-1).tolist()
        node.entropies = (-(logp.exp() * logp).sum(-1)).tolist()
        if self.logits_hook is not None:
            self.logits_hook(node, logp)

    # ---- internals: expansion ------------------------------------------------------------
    def _expand(self, requests: Sequence[tuple[Node, int]], params: SamplingParams) -> list[list[Node]]:
        gen = self._gen if params.seed is None else torch.Generator().manual_seed(params.seed)
        owners = [node for node, n in requests for _ in range(n)]
        rows = [Row(start_pos=node.end_pos) for node in owners]
        first = torch.stack([self.store.get(node.id).next_logits for node in owners])  # (B, V)
        sample_into(rows, first, params, gen)
        contexts = {node.id: self._context(node) for node, _ in requests}
        batch = self._new_batch([contexts[o.id] for o in owners], params.max_new_tokens, record=True)
        self.metrics.peak_working_bytes = max(self.metrics.peak_working_bytes, batch.cache.nbytes)
        stop = StopChecker(self.tokenizer, params, self._eos_ids)
        decode_rows(self.backend, batch.cache, rows, params, stop, gen, self._before_step, batch.recorder)
        children = [self._store_child(o, r, batch, i) for i, (o, r) in enumerate(zip(owners, rows, strict=True))]
        out, k = [], 0
        for _, n in requests:
            out.append(children[k : k + n])
            k += n
        return out

    def _before_step(self, working: int, live_rows: int) -> None:
        self.memory.reserve(working, "decode", ahead=live_rows * DECODE_AHEAD)

    def _store_child(self, parent: Node, row: Row, batch: _Batch, index: int) -> Node:
        text = self.tokenizer.decode(row.tokens)
        child = self._new_node(parent, row.tokens, text, GENERATED, start_pos=parent.end_pos)
        child.logprobs, child.entropies, child.stop_reason = row.logprobs, row.entropies, row.stop_reason
        keys, values = batch.cache.extract(index, 0, len(row.tokens))
        self.store.put(child.id, BlockKV.full(keys, values, child.start_pos, row.next_logits))
        self._take_attention(batch, child, index)
        self.metrics.decode_tokens += len(row.tokens)
        return child

    def _context(self, node: Node | None) -> _Gathered:
        """The retained KV of the path ending at ``node`` (empty for None), with what it holds."""
        shape = self.backend.shape
        if node is None:
            empty = torch.zeros(shape.layers, shape.kv_heads, 0, shape.head_dim, dtype=shape.dtype, device=shape.device)
            return _Gathered([], [], empty, empty)
        ids = [n.id for n in node.path()]
        keys, values, _ = self.store.gather(ids)
        return _Gathered(ids, [self.store.get(i).kept.clone() for i in ids], keys, values)

    def _new_batch(self, contexts: list[_Gathered], capacity: int, record: bool) -> _Batch:
        cache = self.backend.new_cache([(c.keys, c.values) for c in contexts], capacity=capacity)
        recorder = None
        if record and self.policy.needs_attention:
            recorder = AttentionRecorder(cache.rows, cache.keys.shape[3], self.backend.device)
        return _Batch(cache, recorder, contexts)

    # ---- internals: attention statistics -------------------------------------------------
    def _take_attention(self, batch: _Batch, node: Node, row: int) -> None:
        """Scatter row ``row``'s recorded attention to its context blocks and to ``node``'s block."""
        if batch.recorder is None:
            return
        ctx = batch.contexts[row]
        mass, queries = batch.recorder.mass[row], float(batch.recorder.queries[row])
        self.store.add_attention(ctx.block_ids, ctx.kept, mass[: ctx.length], queries)
        start = batch.cache.ctx_len
        own = self.store.get(node.id)
        own.attention += mass[start : start + node.length].cpu()
        own.observers += queries / 2  # causal: a block's own queries see half of it on average

    # ---- internals: bookkeeping ----------------------------------------------------------
    def _new_node(self, parent: Node | None, ids: list[int], text: str, kind: str, start_pos: int) -> Node:
        node = Node(id=self._next_id, parent=parent, token_ids=list(ids), text=text, kind=kind, start_pos=start_pos)
        self._next_id += 1
        self.nodes[node.id] = node
        self.all_nodes[node.id] = node
        if parent is not None:
            parent.children.append(node)
        self.metrics.nodes_created += 1
        return node

    def _check_live(self, node: Node) -> None:
        if node.released:
            raise ValueError(f"{node!r} was released; it cannot be expanded or appended to")
        if self.nodes.get(node.id) is not node:
            raise ValueError(f"{node!r} belongs to another Runtime")

    def _check_requests(self, requests: Sequence[tuple[Node, int]]) -> None:
        if not requests:
            raise ValueError("expand_many needs at least one (node, n) request")
        for node, n in requests:
            self._check_live(node)
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"n={n!r} for {node!r} must be a positive integer")

    @contextmanager
    def _op(self, name: str) -> Iterator[None]:
        start, fwd0, secs0 = time.perf_counter(), self.backend.forward_calls, self.backend.model_seconds
        self.memory.peak_tokens = self.store.resident_tokens
        try:
            yield
        finally:
            m = self.metrics
            m.runtime_seconds += time.perf_counter() - start
            m.forward_calls += self.backend.forward_calls - fwd0
            m.model_seconds += self.backend.model_seconds - secs0
            peak = max(self.memory.peak_tokens, self.store.resident_tokens)
            m.note_peak(peak, self.backend.shape.bytes_per_token)
            m.sync_store(self.store, self.memory.events)
            m.trace.append(
                TracePoint(
                    step=len(m.trace),
                    op=name,
                    resident_tokens=self.store.resident_tokens,
                    resident_bytes=self.store.resident_bytes,
                    peak_tokens=peak,
                    t=time.perf_counter() - self._t0,
                    host_tokens=self.store.host_tokens,
                    events=len(self.memory.events.records),
                    rehydrations=self.store.counters.rehydrations,
                    branch_switches=m.branch_switch_events,
                )
            )


@dataclass(slots=True)
class _Gathered:
    """A path's KV as gathered for one batch, with the retained indices of each block at that time.

    keys / values: (L, H_kv, T, D); kept[i]: block_ids[i]'s kept indices, in gather order.
    """

    block_ids: list[int]
    kept: list[torch.Tensor]
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.keys.shape[2])


@dataclass(slots=True)
class _Batch:
    """One forward batch: its cache, its attention recorder (or None), each row's context."""

    cache: BatchCache
    recorder: AttentionRecorder | None
    contexts: list[_Gathered]


def _eos_ids(loaded: LoadedModel) -> set[int]:
    ids = set()
    tok_eos = getattr(loaded.tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    cfg_eos = getattr(loaded.model.config, "eos_token_id", None)
    if isinstance(cfg_eos, int):
        ids.add(cfg_eos)
    elif isinstance(cfg_eos, list):
        ids.update(int(i) for i in cfg_eos)
    return ids
