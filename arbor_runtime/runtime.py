"""The public runtime: a search tree whose KV is kept once per thought block.

Controllers call ``new_tree``, ``expand``/``expand_many``, ``append``, ``set_value`` and
``release``; the runtime gathers each path's KV from the store, runs the backend, stores new
blocks, keeps the accounting, and asks the policy for room when the budget is tight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from arbor_runtime.backend import ModelBackend
from arbor_runtime.errors import BudgetError, KVBudgetExceeded
from arbor_runtime.generation import Row, StopChecker, decode_rows, sample_into
from arbor_runtime.kv import BlockKV, KVStore
from arbor_runtime.loading import LoadedModel
from arbor_runtime.metrics import RuntimeMetrics, TracePoint
from arbor_runtime.policies import Policy, build_policy
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import FORCED, GENERATED, PROMPT, Node

log = logging.getLogger(__name__)


class Runtime:
    """Tree-structured generation over one model with per-block KV reuse.

    Args:
        loaded: model and tokenizer from :func:`arbor_runtime.load_model`.
        policy: a policy name (``"full"``) or a built :class:`Policy`.
        budget_tokens: cap on resident device KV tokens (used when ``policy`` is a name).
        seed: seeds the runtime's sampling generator.
    """

    def __init__(
        self, loaded: LoadedModel, policy: str | Policy = "full", budget_tokens: int | None = None, seed: int = 0
    ) -> None:
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.policy = build_policy(policy, budget_tokens=budget_tokens)
        self.backend = ModelBackend(self.model)
        self.store = KVStore(self.backend.shape)
        self.metrics = RuntimeMetrics()
        self.nodes: dict[int, Node] = {}
        self._next_id = 0
        self._gen = torch.Generator().manual_seed(seed)
        self._eos_ids = _eos_ids(loaded)
        self._t0 = time.perf_counter()
        self._op_peak = 0

    # ---- public API ----------------------------------------------------------------------
    @property
    def budget_tokens(self) -> int | None:
        return self.policy.budget_tokens

    def new_tree(self, prompt: str) -> Node:
        """Start a tree whose root block is ``prompt`` (prefilled once)."""
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        if not ids:
            raise ValueError("prompt is empty: a root block needs at least one token")
        budget = self.budget_tokens
        if budget is not None and len(ids) > budget:
            raise BudgetError(
                f"budget_tokens={budget} is smaller than the root prompt ({len(ids)} tokens): "
                "the active path could never fit; raise the budget"
            )
        with self._op("new_tree"):
            node = self._new_node(None, ids, prompt, PROMPT, start_pos=0)
            self._prefill(node, with_logprobs=False)
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
        with self._op("expand"):
            return self._expand(requests, params)

    def append(self, node: Node, text: str) -> Node:
        """Add a teacher-forced child block holding ``text``; its ``logprobs`` score the text."""
        self._check_live(node)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"append text {text!r} tokenizes to nothing")
        with self._op("append"):
            child = self._new_node(node, ids, text, FORCED, start_pos=node.end_pos)
            self._prefill(child, with_logprobs=True)
        return child

    def set_value(self, node: Node, value: float) -> None:
        """Record the search value a verifier gave ``node`` (policies may use it)."""
        node.value = float(value)

    def release(self, node: Node) -> None:
        """Drop ``node``'s subtree and its KV; the node stays readable but cannot be expanded."""
        with self._op("release"):
            for sub in list(node.subtree()):
                if sub.id in self.store:
                    self.store.pop(sub.id)
                sub.released = True
                self.nodes.pop(sub.id, None)
                self.metrics.nodes_released += 1
            if node.parent is not None:
                node.parent.children.remove(node)

    def path_token_ids(self, node: Node) -> list[int]:
        """Token ids from the root to ``node`` inclusive (the flattened text's ids)."""
        return [t for n in node.path() for t in n.token_ids]

    def path_text(self, node: Node) -> str:
        return "".join(n.text for n in node.path())

    def next_token_logprobs(self, node: Node) -> torch.Tensor:
        """(V,) log-probabilities of the token after ``node``'s path."""
        return torch.log_softmax(self.store.get(node.id).next_logits, dim=-1)

    # ---- internals: prefill --------------------------------------------------------------
    def _prefill(self, node: Node, with_logprobs: bool) -> None:
        """Compute ``node``'s block KV over its ancestors' KV (its tokens are new)."""
        ids = node.token_ids
        self._reserve(len(ids), "prefill")
        cache = self.backend.new_cache([self._context(node.parent)], capacity=len(ids))
        input_ids = torch.tensor([ids])
        positions = torch.arange(node.start_pos, node.end_pos).unsqueeze(0)
        logits = self.backend.forward(cache, input_ids, positions, logits_to_keep=0 if with_logprobs else 1)[0]
        if with_logprobs:
            self._score_forced(node, logits)
        keys, values = cache.extract(0, 0, len(ids))
        self.store.put(node.id, BlockKV.whole(keys, values, node.start_pos, logits[-1].float().cpu().clone()))
        self.metrics.prefill_tokens += len(ids)

    def _score_forced(self, node: Node, logits: torch.Tensor) -> None:
        """Fill logprobs/entropies of a forced block. logits: (T, V), row i predicts token i+1."""
        prev = self.store.get(node.parent.id).next_logits.to(logits.device)
        dists = torch.cat([prev.unsqueeze(0), logits[:-1].float()], dim=0)  # (T, V) predicting each token
        logp = torch.log_softmax(dists, dim=-1)
        tokens = torch.tensor(node.token_ids, device=logits.device)
        node.logprobs = logp.gather(-1, tokens.view(-1, 1)).squeeze(-1).tolist()
        node.entropies = (-(logp.exp() * logp).sum(-1)).tolist()

    # ---- internals: expansion ------------------------------------------------------------
    def _expand(self, requests: Sequence[tuple[Node, int]], params: SamplingParams) -> list[list[Node]]:
        gen = self._gen if params.seed is None else torch.Generator().manual_seed(params.seed)
        owners = [node for node, n in requests for _ in range(n)]
        rows = [Row(start_pos=node.end_pos) for node in owners]
        first = torch.stack([self.store.get(node.id).next_logits for node in owners])  # (B, V)
        sample_into(rows, first, params, gen)
        contexts = {node.id: self._context(node) for node, _ in requests}
        cache = self.backend.new_cache([contexts[node.id] for node in owners], capacity=params.max_new_tokens)
        self.metrics.peak_working_bytes = max(self.metrics.peak_working_bytes, cache.nbytes)
        stop = StopChecker(self.tokenizer, params, self._eos_ids)
        decode_rows(self.backend, cache, rows, params, stop, gen, lambda w: self._reserve(w, "decode", working=True))
        children = [
            self._store_child(owner, row, cache, i) for i, (owner, row) in enumerate(zip(owners, rows, strict=True))
        ]
        out, k = [], 0
        for _, n in requests:
            out.append(children[k : k + n])
            k += n
        return out

    def _store_child(self, parent: Node, row: Row, cache, index: int) -> Node:
        text = self.tokenizer.decode(row.tokens)
        child = self._new_node(parent, row.tokens, text, GENERATED, start_pos=parent.end_pos)
        child.logprobs, child.entropies, child.stop_reason = row.logprobs, row.entropies, row.stop_reason
        keys, values = cache.extract(index, 0, len(row.tokens))
        self.store.put(child.id, BlockKV.whole(keys, values, child.start_pos, row.next_logits))
        self.metrics.decode_tokens += len(row.tokens)
        return child

    def _context(self, node: Node | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Retained KV of the path ending at ``node``: (L, H_kv, T, D) keys and values."""
        if node is None:
            shape = self.backend.shape
            empty = torch.zeros(shape.layers, shape.kv_heads, 0, shape.head_dim, dtype=shape.dtype, device=shape.device)
            return empty, empty
        keys, values, _ = self.store.gather([n.id for n in node.path()])
        return keys, values

    # ---- internals: budget and bookkeeping -----------------------------------------------
    def _reserve(self, extra: int, where: str, working: bool = False) -> None:
        """Make sure resident blocks + ``extra`` working tokens fit the budget, else raise OOM."""
        needed = self.store.resident_tokens + extra
        budget = self.budget_tokens
        if budget is not None and needed > budget and not self.policy.make_room(self, needed - budget):
            raise KVBudgetExceeded(needed, budget, where)
        needed = self.store.resident_tokens + extra
        self._op_peak = max(self._op_peak, needed)
        self.metrics.note_peak(needed, self.backend.shape.bytes_per_token)

    def _new_node(self, parent: Node | None, ids: list[int], text: str, kind: str, start_pos: int) -> Node:
        node = Node(id=self._next_id, parent=parent, token_ids=list(ids), text=text, kind=kind, start_pos=start_pos)
        self._next_id += 1
        self.nodes[node.id] = node
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
        self._op_peak = self.store.resident_tokens
        try:
            yield
        finally:
            m = self.metrics
            m.runtime_seconds += time.perf_counter() - start
            m.forward_calls += self.backend.forward_calls - fwd0
            m.model_seconds += self.backend.model_seconds - secs0
            m.note_peak(self.store.resident_tokens, self.backend.shape.bytes_per_token)
            m.trace.append(
                TracePoint(
                    step=len(m.trace),
                    op=name,
                    resident_tokens=self.store.resident_tokens,
                    resident_bytes=self.store.resident_bytes,
                    peak_tokens=max(self._op_peak, self.store.resident_tokens),
                    t=time.perf_counter() - self._t0,
                )
            )


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
