"""Where blocks are made: prefills and recomputes (forwards of a block's tokens over its stored
path, their KV stored), and finished rows (:meth:`Prefiller.child_from_row`).

A prompt (a tree's root) or a forced block (``append``) is a :class:`PrefillJob` the engine runs
like any other work. Its run is a generator: for each chunk it yields a
:class:`~arbor_runtime.engine.scheduler.Request` (the tokens left at the end of its path) and the
engine sends back the slots the scheduler admitted (all of them when they fit, else a chunk, under
a policy that may shrink the active path or degrades below its floor), once the executor has made
the room and recomputed what the path lacks; each chunk is one forward whose new KV goes to the
store. A job that must wait stays suspended where it stopped; in a later engine cycle the engine
checks it again (:meth:`PrefillJob.check`: its parent may have been released meanwhile) and plans
its request anew.

The :class:`Prefiller` takes its collaborators (store, memory manager, node table, runner,
accounts, planner, the running rows' owners, the tokenizer's decode) rather than the runtime or the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from arbor_runtime.engine.scheduler import Request
from arbor_runtime.kv import BlockKV, Extent
from arbor_runtime.tree import FORCED, GENERATED, Node

if TYPE_CHECKING:
    from arbor_runtime.accounts import Accounts
    from arbor_runtime.generation import Row
    from arbor_runtime.kv import KVStore
    from arbor_runtime.memory import MemoryManager
    from arbor_runtime.nodes import NodeTable
    from arbor_runtime.planner import MemoryPlanner
    from arbor_runtime.runner import Runner

__all__ = ["PrefillJob", "Prefiller"]


@dataclass(eq=False, slots=True)
class PrefillJob:
    """A prompt or forced block being prefilled; resumable when it had to wait for room."""

    prefiller: Prefiller
    parent: Node | None
    ids: list[int]
    text: str
    kind: str
    seed: int = 0
    node: Node | None = None
    examples: tuple[int, int] | None = None  # a root's few-shot span (``Node.examples``)
    done: int = 0
    parts: list[torch.Tensor] = field(default_factory=list)

    @property
    def start_pos(self) -> int:
        return 0 if self.parent is None else self.parent.end_pos

    def demand(self) -> tuple[Node | None, int]:
        """(path end, slots) this prefill still needs: its parent's path and the tokens left."""
        return self.parent, len(self.ids) - self.done

    def check(self) -> None:
        """Its parent is still live (NodeError when another operation released it)."""
        if self.parent is not None:
            self.prefiller.table.check_live(self.parent)

    def __call__(self) -> Generator[Request, int, Node]:
        self.check()
        return self.prefiller.prefill(self)


class Prefiller:
    """Prefill and recompute forwards of one runtime (driver thread only).

    Args:
        store: the block store (slots, blocks, attention records); memory: the memory manager
        (begin / node end / after events); table: the node table; runner: batches and forwards;
        accounts: the work being carried out, where its counts go, the peaks of works in flight;
        planner: whether a forward records attention statistics; owners: ``owners()`` -> the nodes
        whose rows are decoding (their paths stay active after a prefill); decode: token ids -> a
        finished row's text.
    """

    def __init__(
        self,
        store: KVStore,
        memory: MemoryManager,
        table: NodeTable,
        runner: Runner,
        accounts: Accounts,
        planner: MemoryPlanner,
        owners: Callable[[], list[Node]],
        decode: Callable[[list[int]], str],
    ) -> None:
        self.store, self.memory, self.table, self.runner = store, memory, table, runner
        self.accounts, self.planner, self.owners, self.decode = accounts, planner, owners, decode
        #: called with (node, (T, V) log-probs) for every forced block; used by trace replay
        self.logits_hook: Callable[[Node, torch.Tensor], None] | None = None

    def job(
        self,
        parent: Node | None,
        ids: list[int],
        text: str,
        kind: str,
        seed: int = 0,
        examples: tuple[int, int] | None = None,
    ) -> PrefillJob:
        """The work that prefills ``ids`` as a block under ``parent`` (None: a tree's root, whose
        few-shot span is ``examples``)."""
        return PrefillJob(self, parent, ids, text, kind, seed=seed, examples=examples)

    def prefill(self, state: PrefillJob) -> Generator[Request, int, Node]:
        """A prefill work: create the node, then per chunk ask for its room and forward it."""
        if state.node is None:
            state.node = self.new_node(state.parent, state.ids, state.text, state.kind, state.start_pos)
            if state.parent is None:
                self.table.tree_seeds[state.node.id] = state.seed
                state.node.examples = state.examples
            self.memory.begin([state.parent] if state.parent is not None else [], self.accounts.work.account)
        node = state.node
        try:
            while state.done < node.length:
                count = yield Request(node, node.length - state.done, "prefill")  # the slots admitted
                state.parts.append(self._forward_block(node, state.done, count, 0 if state.kind == FORCED else 1))
                state.done += count
        except GeneratorExit:  # dropped by an engine abort while waiting: left as it was
            raise
        except BaseException:  # undo the admission: the chunks stored so far, the node, its place in the plan
            self.undo(node)
            raise
        self.store.get(node.id).next_logits = state.parts[-1][-1].float().cpu().clone()
        if state.kind == FORCED:
            self._score_forced(node, torch.cat(state.parts))
        for m in self.accounts.targets():
            m.prefill_tokens += node.length
        self.memory.node_end(node)
        parents = [state.parent] if state.parent is not None else []
        self.memory.after(parents, [node], forced=state.kind == FORCED, running=self.owners())
        self.accounts.note_peak()
        return node

    def recompute_all(self, nodes: Sequence[Node]) -> None:
        """Rebuild, in order (parents first), the tokens these blocks lost from every tier."""
        if not nodes:
            return
        start = time.perf_counter()
        for node in nodes:
            self._recompute(node)
        for m in self.accounts.targets():
            m.recompute_seconds += time.perf_counter() - start

    def new_node(
        self, parent: Node | None, ids: list[int], text: str, kind: str, start_pos: int, node_id: int | None = None
    ) -> Node:
        """A node for a new block, counted where the current work's counts go."""
        return self.table.new(parent, ids, text, kind, start_pos, self.accounts.targets(), node_id)

    def undo(self, node: Node) -> None:
        """A node whose operation failed: its KV, its place in the memory manager's plan and the node
        itself go, as if never created."""
        if not node.released:
            self.memory.forget(self.table.forget_subtree(node, self.accounts.targets()))
        self.table.discard(node, self.accounts.targets())

    def child_from_row(self, row: Row) -> Node:
        """A finished row becomes a child block: its used slots are the block, the rest are freed.

        When anything fails on the way, the row's slots and the child go, as if it never finished."""
        n, child = len(row.tokens), None
        try:
            text = self.decode(row.tokens)
            child = self.new_node(row.owner, row.tokens, text, GENERATED, row.owner.end_pos, row.child_id)
            child.logprobs, child.entropies, child.stop_reason = row.logprobs, row.entropies, row.stop_reason
            used, spare = _split(row.extents, n)
            self.store.put(child.id, BlockKV.from_extents(used, child.start_pos, row.next_logits))
            row.extents = []  # the used slots are the block's now
            self.runner.free_slots(spare)
            # causal: each scored query saw half of the block on average (none when statistics were off)
            self.store.add_attention(child.id, torch.arange(n), row.attention[:n], row.scored / 2)
            if row.head_attention is not None:
                self.store.add_head_attention(child.id, torch.arange(n), row.head_attention[..., :n])
            for m in self.accounts.targets():
                m.decode_tokens += n
            self.memory.node_end(child)
        except BaseException:
            if child is not None:
                self.undo(child)
            raise
        finally:
            self.runner.free_slots(row.extents)  # a row that failed before its block was stored
            row.extents = []
        return child

    def _forward_block(self, node: Node, offset: int, count: int, logits_to_keep: int) -> torch.Tensor:
        """Forward tokens [offset, offset + count) of ``node`` over its path; store their KV.

        Returns (k, V) logits. Earlier chunks of the same block are part of the context.
        """
        with self._allocating(count) as extents:
            context = [a.id for a in node.kv_path()[:-1]] + ([node.id] if offset else [])
            slots = _slots(extents).view(1, count)
            stats, stats_from = self.planner.prefill_statistics(count, [(node.parent, node.length)])
            batch = self.runner.batch([context], count, slots, stats=stats, stats_from=stats_from)
            positions = torch.arange(node.start_pos + offset, node.start_pos + offset + count).unsqueeze(0)
            ids = torch.tensor([node.token_ids[offset : offset + count]])
            self.accounts.note_peak()
            logits = self.runner.forward(batch, ids, positions, logits_to_keep)[0]
        own = torch.arange(offset, offset + count)
        if offset == 0:  # from here on the store owns the slots (a release frees them)
            self.store.put(node.id, BlockKV.from_extents(extents, node.start_pos, None))
        else:
            self.store.add_tokens(node.id, extents, own, op="extend")
        self.runner.take_attention(batch)
        if batch.own_mass is not None:  # causal: a block's own queries see half of it on average
            self.store.add_attention(node.id, own, batch.own_mass[0], (count - stats_from) / 2)
        if batch.own_head_mass is not None:
            self.store.add_head_attention(node.id, own, batch.own_head_mass[0])
        return logits

    @contextmanager
    def _allocating(self, count: int) -> Iterator[list[Extent]]:
        """``count`` pool slots for a forward's new KV, given back when anything inside fails: a failed
        forward (a bad input, a device error) leaves the pool as it found it."""
        extents = self.store.pool.alloc(count)
        try:
            yield extents
        except BaseException:
            self.runner.free_slots(extents)
            raise

    def _recompute(self, node: Node) -> None:
        """Rebuild a block's tokens dropped from every tier by prefilling it over its (whole) ancestors.

        Only the missing tokens get slots (the admission counted them); the retained ones stay as
        they are.
        """
        blk = self.store.get(node.id)
        if blk.per_head:  # each head holds other tokens: what a head lacks is no one token, so all are rebuilt
            self.store.clear_device(node.id)
        missing = torch.nonzero(~torch.isin(torch.arange(blk.length), blk.kept)).squeeze(1)
        with self._allocating(int(missing.numel())) as extents:
            write = torch.full((1, blk.length), -1, dtype=torch.long)
            write[0, missing] = _slots(extents)
            self.accounts.note_peak()
            batch = self.runner.batch([[a.id for a in node.kv_path()[:-1]]], blk.length, write, stats=False)
            positions = torch.arange(node.start_pos, node.end_pos).unsqueeze(0)
            self.runner.forward(batch, torch.tensor([node.token_ids]), positions, 1)
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
