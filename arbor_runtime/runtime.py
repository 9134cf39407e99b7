"""The public runtime: a search tree whose KV is kept once per thought block.

Controllers call ``new_tree``, ``expand``/``expand_many``, ``append``, ``set_value`` and
``release``. An expansion is a small serving loop over the requested rows: the memory manager
admits as many as fit (schedule), the backend runs one step for them with attention that reads
every block in place (run), rows sample their next token or finish, and waiting rows take the
place of finished ones (postprocess). New blocks go to the store; the memory manager turns each
operation into policy events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from arbor_runtime.backend import ModelBackend, TreeBatch, context_groups
from arbor_runtime.errors import BudgetError, KVBudgetExceeded
from arbor_runtime.generation import Row, StopChecker, decode_batch, postprocess, sample_into
from arbor_runtime.kv import BlockKV, Extent, KVStore
from arbor_runtime.loading import LoadedModel
from arbor_runtime.memory import MemoryManager
from arbor_runtime.metrics import RuntimeMetrics, TracePoint
from arbor_runtime.policies import Policy, build_policy
from arbor_runtime.sampling import SamplingParams, row_seed
from arbor_runtime.tree import FORCED, GENERATED, PROMPT, Node

log = logging.getLogger(__name__)

#: pool slots a generating row is given at a time (like a KV page): its first PAGE tokens at
#: admission, then PAGE more whenever it fills them
PAGE = 8


class Runtime:
    """Tree-structured generation over one model with per-block KV reuse.

    Args:
        loaded: model and tokenizer from :func:`arbor_runtime.load_model`.
        policy: a policy name (``"full"``, ``"arbor"``, ...) or a built :class:`Policy`.
        budget_tokens: cap on device KV tokens (used when ``policy`` is a name); the device pool
            holds exactly this many token slots.
        seed: seeds the runtime's sampling streams when a call gives no seed.
        fast_kernel: use the fused (out, lse) attention op when torch has one (False: the matmul
            reference, for tests).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        policy: str | Policy = "full",
        budget_tokens: int | None = None,
        seed: int = 0,
        fast_kernel: bool = True,
    ) -> None:
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.policy = build_policy(policy, budget_tokens=budget_tokens)
        if hasattr(self.policy, "vocab_size"):
            self.policy.vocab_size = int(self.model.config.vocab_size)
        self.backend = ModelBackend(self.model, fast_kernel=fast_kernel)
        self.store = KVStore(self.backend.shape, capacity=self.policy.budget_tokens)
        self.metrics = RuntimeMetrics()
        self.nodes: dict[int, Node] = {}  # live nodes
        self.all_nodes: dict[int, Node] = {}  # every node ever created, released ones too
        #: public operations in call order (JSON-friendly), for trace recording and replay
        self.oplog: list[dict] = []
        #: called with (node, (T, V) log-probs) for every forced block; used by trace replay
        self.logits_hook: Callable[[Node, torch.Tensor], None] | None = None
        self.memory = MemoryManager(self.store, self.policy, self.nodes)
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
        """Start a tree whose root block is exactly these token ids (trace replay uses this).

        A prompt larger than the budget is prefilled in chunks under policies that may evict from
        the active path; under the others (``full``, ``arbor``) it is refused up front.
        """
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("prompt is empty: a root block needs at least one token")
        budget = self.budget_tokens
        if budget is not None and len(ids) > budget and not self.policy.shrinks_active_path:
            raise BudgetError(
                f"budget_tokens={budget} is smaller than the root prompt ({len(ids)} tokens): "
                "the active path could never fit; raise the budget"
            )
        text = self.tokenizer.decode(ids) if text is None else text
        with self._op("new_tree"):
            self.memory.begin([])
            node = self._new_node(None, ids, text, PROMPT, start_pos=0)
            self._prefill_new(node, with_logprobs=False)
            self.memory.after([], [node])
        self.oplog.append({"op": "new_tree", "node": node.id, "ids": list(ids)})
        return node

    def expand(self, node: Node, n: int = 1, sampling: SamplingParams | None = None) -> list[Node]:
        """Sample ``n`` child thoughts of ``node`` (batched); returns the children."""
        return self.expand_many([(node, n)], sampling)[0]

    def expand_many(
        self, requests: Sequence[tuple[Node, int]], sampling: SamplingParams | None = None
    ) -> list[list[Node]]:
        """Sample children for several nodes (any depths), batched as the budget allows.

        Rows that do not fit the budget together wait and join as others finish; each row samples
        from its own stream, so the children are the same however the rows were batched.

        Args:
            requests: (node, n) pairs.
        Returns:
            one list of children per request, in request order.
        Raises:
            KVBudgetExceeded: a single row (its path plus its new tokens) cannot fit.
        """
        params = sampling or SamplingParams()
        self._check_requests(requests)
        targets = [node for node, _ in requests]
        with self._op("expand"):
            self.memory.begin(targets)
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
            self.memory.begin([node])
            child = self._new_node(node, ids, text, FORCED, start_pos=node.end_pos)
            self._prefill_new(child, with_logprobs=True)
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
            gone = self._forget_subtree(node)
            self.memory.forget(gone)
        self.oplog.append({"op": "release", "node": node.id})

    def compress(self, target_tokens: int) -> int:
        """Ask the policy, now, to bring resident block KV down to ``target_tokens`` (one MemoryThreshold).

        The one-shot compression of a context that prefill-time methods (SnapKV, kvpress presses)
        do: prefill whole, then keep ``target_tokens``. Which tokens stay is the policy's plan, as
        for any memory event; a policy that never frees memory (``full``) keeps everything, and
        ``arbor`` keeps the active path whole. Returns the resident block tokens afterwards.
        """
        if isinstance(target_tokens, bool) or not isinstance(target_tokens, int) or target_tokens < 0:
            raise ValueError(f"compress target_tokens={target_tokens!r} must be a non-negative number of tokens")
        with self._op("compress"):
            self.memory.compress(target_tokens)
        self.oplog.append({"op": "compress", "target": target_tokens})
        return self.store.resident_tokens

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
        n_host = self.store.host_count(node.id)
        return {"device": blk.kept_tokens, "host": n_host, "dropped": blk.length - blk.kept_tokens - n_host}

    def device_kv_bytes(self) -> int:
        """Bytes of every device KV tensor the runtime holds (the pool: blocks and rows in flight)."""
        return self.store.pool.nbytes

    # ---- internals: prefill --------------------------------------------------------------
    def _prefill_new(self, node: Node, with_logprobs: bool) -> None:
        """Prefill a new prompt/forced block; on failure the node leaves the tree again."""
        try:
            self._prefill(node, with_logprobs)
        except BaseException:
            self._forget_subtree(node)
            self._discard(node)
            raise
        self.memory.node_end(node)

    def _prefill(self, node: Node, with_logprobs: bool) -> None:
        """Compute ``node``'s block KV over its ancestors' KV, in chunks when it does not fit at once."""
        done, parts = 0, []
        while done < node.length:
            count = self._admit_prefill(node, node.length - done)
            logits = self._forward_block(node, done, count, logits_to_keep=0 if with_logprobs else 1)
            parts.append(logits)
            done += count
        self.store.get(node.id).next_logits = parts[-1][-1].float().cpu().clone()
        if with_logprobs:
            self._score_forced(node, torch.cat(parts))
        self.metrics.prefill_tokens += node.length

    def _admit_prefill(self, node: Node, left: int) -> int:
        """Admit the next chunk of ``node``'s tokens: all ``left`` when they fit, else a chunk."""
        count = left
        admission = self.memory.admit([(node, count)], [], shrink_active=False)
        if not admission.rows and self.policy.shrinks_active_path:
            count = min(left, self.policy.chunk_tokens())
            admission = self.memory.admit([(node, count)], [])
        if not admission.rows:
            raise KVBudgetExceeded(self.memory.used + count, self.budget_tokens, "prefill")
        self._recompute_all(admission.recompute)
        return count

    def _forward_block(self, node: Node, offset: int, count: int, logits_to_keep: int) -> torch.Tensor:
        """Forward tokens [offset, offset + count) of ``node`` over its path; store their KV.

        Returns (k, V) logits. Earlier chunks of the same block are part of the context.
        """
        extents = self.store.pool.alloc(count)
        context = [a.id for a in node.path()[:-1]] + ([node.id] if offset else [])
        slots = _slots(extents).view(1, count)
        window = self.policy.observation_window
        stats_from = max(0, count - window) if window else 0
        batch = self._batch([context], count, slots, stats=self.policy.needs_attention, stats_from=stats_from)
        positions = torch.arange(node.start_pos + offset, node.start_pos + offset + count).unsqueeze(0)
        ids = torch.tensor([node.token_ids[offset : offset + count]])
        logits = self.backend.forward(batch, ids, positions, logits_to_keep)[0]
        own = torch.arange(offset, offset + count)
        if offset == 0:
            self.store.put(node.id, BlockKV.from_extents(extents, node.start_pos, None))
        else:
            self.store.add_tokens(node.id, extents, own, op="extend")
        self._take_attention(batch)
        if batch.own_mass is not None:  # causal: a block's own queries see half of it on average
            self.store.add_attention(node.id, own, batch.own_mass[0], (count - stats_from) / 2)
        return logits

    def _recompute_all(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            self._recompute(node)

    def _recompute(self, node: Node) -> None:
        """Rebuild a block's tokens dropped from every tier by prefilling it over its (whole) ancestors.

        Only the missing tokens get slots (the admission counted them); the retained ones stay as
        they are.
        """
        blk = self.store.get(node.id)
        missing = torch.nonzero(~torch.isin(torch.arange(blk.length), blk.kept)).squeeze(1)
        extents = self.store.pool.alloc(int(missing.numel()))
        write = torch.full((1, blk.length), -1, dtype=torch.long)
        write[0, missing] = _slots(extents)
        batch = self._batch([[a.id for a in node.path()[:-1]]], blk.length, write, stats=False)
        positions = torch.arange(node.start_pos, node.end_pos).unsqueeze(0)
        self.backend.forward(batch, torch.tensor([node.token_ids]), positions, logits_to_keep=1)
        self.store.add_tokens(node.id, extents, missing)

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
        """schedule -> run -> postprocess until every requested row has finished."""
        rows = self._new_rows(requests, params)
        waiting, running, children = list(rows), [], {}
        stop = StopChecker(self.tokenizer, params, self._eos_ids)
        try:
            while waiting or running:
                self._admit_rows(waiting, running, params, stop)
                self._grow_rows(waiting, running, params)
                stats = self.policy.needs_attention and not self.policy.observation_window
                batch, ids, pos = decode_batch(self.store, running, stats, self.backend.kernel)
                logits = self.backend.forward(batch, ids, pos)[:, -1]  # (R, V)
                self._take_attention(batch)
                for row in postprocess(running, batch, logits, params, stop):
                    running.remove(row)
                    children[row.order] = self._finish_row(row)
        except BaseException:
            for row in running:
                self._free_slots(row.extents)
            for child in children.values():
                self._forget_subtree(child)
            raise
        self._order_nodes(list(children.values()))
        out, k = [], 0
        for _, n in requests:
            out.append([children[i] for i in range(k, k + n)])
            k += n
        return out

    def _new_rows(self, requests: Sequence[tuple[Node, int]], params: SamplingParams) -> list[Row]:
        """One row per requested child, its node id and sampling stream fixed up front."""
        base = params.seed if params.seed is not None else int(torch.randint(0, 1 << 62, (1,), generator=self._gen))
        rows = []
        for node, n in requests:
            for _ in range(n):
                rows.append(
                    Row(owner=node, child_id=self._next_id, order=len(rows), seed=row_seed(base, self._next_id))
                )
                self._next_id += 1
        return rows

    def _admit_rows(self, waiting: list[Row], running: list[Row], params: SamplingParams, stop: StopChecker) -> None:
        """Start as many waiting rows as the memory manager admits; sample their first tokens."""
        if not waiting:
            return
        first = min(PAGE, params.max_new_tokens)
        admission = self.memory.admit([(r.owner, first) for r in waiting], [r.owner for r in running])
        if not admission.rows and not running:
            raise KVBudgetExceeded(self._need_alone(waiting[0].owner, first), self.budget_tokens, "expand")
        self._recompute_all(admission.recompute)
        starting = waiting[: admission.rows]
        del waiting[: admission.rows]
        for row in starting:
            row.add_slots(self.store.pool.alloc(first))
        logits = torch.stack([self.store.get(r.owner.id).next_logits for r in starting]) if starting else None
        if logits is not None:
            sample_into(starting, logits, params, stop)
        running.extend(starting)

    def _grow_rows(self, waiting: list[Row], running: list[Row], params: SamplingParams) -> None:
        """Give every row that has filled its slots PAGE more; preempt the youngest rows when even
        the policy cannot make room (they restart later, sampling the same tokens)."""
        while True:
            needy = [r for r in running if r.capacity <= r.fed]
            need = sum(min(PAGE, params.max_new_tokens - r.capacity) for r in needy)
            if not needy or self.memory.make_room(need, PAGE * len(running), [r.owner for r in running]):
                break
            if len(running) == 1:
                raise KVBudgetExceeded(self._need_alone(running[0].owner, params.max_new_tokens), self.budget_tokens)
            victim = running.pop()
            self._free_slots(victim.restart())
            waiting.insert(sum(r.order < victim.order for r in waiting), victim)
            self.metrics.preemptions += 1
        for row in needy:
            page = min(PAGE, params.max_new_tokens - row.capacity)
            got = self.store.pool.extend(row.extents[-1], page)
            row.add_slots([Extent(row.extents[-1].end, got)] if got else [])
            if got < page:
                row.add_slots(self.store.pool.alloc(page - got))

    def _finish_row(self, row: Row) -> Node:
        """A finished row becomes a child block: its used slots are the block, the rest are freed."""
        n = len(row.tokens)
        used, spare = _split(row.extents, n)
        self._free_slots(spare)
        child = self._new_node(
            row.owner, row.tokens, self.tokenizer.decode(row.tokens), GENERATED, row.owner.end_pos, row.child_id
        )
        child.logprobs, child.entropies, child.stop_reason = row.logprobs, row.entropies, row.stop_reason
        self.store.put(child.id, BlockKV.from_extents(used, child.start_pos, row.next_logits))
        self.store.add_attention(child.id, torch.arange(n), row.attention[:n], n / 2)
        self.metrics.decode_tokens += n
        self.memory.node_end(child)
        return child

    def _need_alone(self, node: Node, new_tokens: int) -> int:
        """Device tokens one row under ``node`` needs by itself: its whole path plus its new tokens."""
        return sum(n.length for n in node.path()) + new_tokens

    def _free_slots(self, extents: Sequence[Extent]) -> None:
        for ext in extents:
            self.store.pool.free(ext)

    # ---- internals: batches and attention statistics -------------------------------------
    def _batch(
        self, contexts: list[list[int]], q: int, write: torch.Tensor, stats: bool, stats_from: int = 0
    ) -> TreeBatch:
        groups, kernel = context_groups(self.store, contexts), self.backend.kernel
        return TreeBatch(
            self.store.pool, groups, len(contexts), q, write, stats=stats, kernel=kernel, stats_from=stats_from
        )

    def _take_attention(self, batch: TreeBatch) -> None:
        """Add a forward's attention mass over context blocks to those blocks (queries counted once per block).

        Under an observation window the new record replaces the old one of every token it saw.
        """
        if not batch.stats:
            return
        queries = batch.q - batch.stats_from
        for grp in batch.groups:
            for i, (piece, mass) in enumerate(zip(grp.pieces, grp.mass, strict=True)):
                if self.policy.observation_window and piece.block_id in self.store:
                    self.store.get(piece.block_id).attention[piece.idx] = 0.0
                self.store.add_attention(piece.block_id, piece.idx, mass, grp.n_rows * queries if i == 0 else 0.0)

    # ---- internals: bookkeeping ----------------------------------------------------------
    def _new_node(
        self, parent: Node | None, ids: list[int], text: str, kind: str, start_pos: int, node_id: int | None = None
    ) -> Node:
        if node_id is None:
            node_id, self._next_id = self._next_id, self._next_id + 1
        node = Node(id=node_id, parent=parent, token_ids=list(ids), text=text, kind=kind, start_pos=start_pos)
        self.nodes[node.id] = node
        self.all_nodes[node.id] = node
        if parent is not None:
            parent.children.insert(sum(c.id < node.id for c in parent.children), node)
        self.metrics.nodes_created += 1
        return node

    def _order_nodes(self, created: list[Node]) -> None:
        """Children finish in any order; keep the node tables in id (creation) order."""
        for node in sorted(created, key=lambda n: n.id):
            for table in (self.nodes, self.all_nodes):
                table[node.id] = table.pop(node.id)

    def _forget_subtree(self, node: Node) -> list[int]:
        """Release ``node``'s subtree from the store and the live table; returns the ids."""
        gone = []
        for sub in list(node.subtree()):
            if sub.id in self.store:
                self.store.pop(sub.id)
            sub.released = True
            self.nodes.pop(sub.id, None)
            gone.append(sub.id)
            self.metrics.nodes_released += 1
        if node.parent is not None and node in node.parent.children:
            node.parent.children.remove(node)
        return gone

    def _discard(self, node: Node) -> None:
        """A node whose operation failed: gone as if never created."""
        self.all_nodes.pop(node.id, None)
        self.metrics.nodes_created -= 1
        self.metrics.nodes_released -= 1

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
        pool = self.store.pool
        start, fwd0, secs0 = time.perf_counter(), self.backend.forward_calls, self.backend.model_seconds
        pool.peak_used = pool.used
        try:
            yield
        finally:
            m = self.metrics
            m.runtime_seconds += time.perf_counter() - start
            m.forward_calls += self.backend.forward_calls - fwd0
            m.model_seconds += self.backend.model_seconds - secs0
            peak = max(pool.peak_used, pool.used)
            m.note_peak(peak, self.backend.shape.bytes_per_token)
            m.pool_bytes = pool.nbytes
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


def _slots(extents: Sequence[Extent]) -> torch.Tensor:
    """(N,) pool slots of extents, in order."""
    if not extents:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(e.start, e.end) for e in extents])


def _split(extents: Sequence[Extent], n: int) -> tuple[list[Extent], list[Extent]]:
    """The first ``n`` slots of ``extents`` and the rest, as extents."""
    used, spare, left = [], [], n
    for ext in extents:
        take = min(left, ext.length)
        if take:
            used.append(Extent(ext.start, take))
        if take < ext.length:
            spare.append(Extent(ext.start + take, ext.length - take))
        left -= take
    return used, spare


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
