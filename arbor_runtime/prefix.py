"""Prefixes shared across trees: a prompt's longest stored prefix is attached to, not prefilled again.

Radix style, over the blocks the store already holds (SGLang's radix cache, at token granularity).
When a new tree's prompt shares ``L`` tokens with a stored root block (or with a shared prefix
block), that block is cut at ``L`` (:meth:`KVStore.split`: bookkeeping only, no token moves): the
first part becomes an internal *prefix node* ``P`` whose block both trees read, the old block
keeps the rest. The new root gets its own block for its suffix ``[L, n)``; only that is prefilled,
over ``P``'s KV.

Users never see a prefix node: a root keeps ``parent is None``, ``start_pos == 0``, its whole
prompt as ``token_ids`` and its ``path()``. Its block is held by an internal *twin*
(``root.kv``: same id, ``parent`` the prefix node, ``token_ids`` the suffix, ``start_pos`` L),
and ``Node.kv_path()`` (the path through the twin chain) is what attention, the planner's
active set and the memory manager's restores use. A prefix node is referenced by its internal
children (prefix nodes below it and twins); when the last goes, its block is freed (``release``).

Which prefix is shared: the longest among live trees' complete root blocks and prefix blocks,
found by walking the internal forest from the top. A cut is made only for a piece of at least
``min_tokens`` (so a common BOS or chat header does not split every block), and a prompt always
keeps at least its last token in its own block (its next-token logits, and room for children).
Blocks partly evicted to the host tier are shared as they are (the split carries their residency;
an admission makes the prefix whole like any block on an active path); a token dropped from every
tier ends what can be shared, so a tree never reads a prefix that a separate tree would hold whole.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from arbor_runtime.engine.prefill import PrefillJob
from arbor_runtime.tree import PROMPT, Node

if TYPE_CHECKING:
    from arbor_runtime.accounts import Accounts
    from arbor_runtime.engine.prefill import Prefiller
    from arbor_runtime.engine.scheduler import Request
    from arbor_runtime.kv import KVStore
    from arbor_runtime.memory import MemoryManager
    from arbor_runtime.nodes import NodeTable
    from arbor_runtime.policies import Policy

log = logging.getLogger(__name__)

#: shortest piece of a block worth cutting out for sharing (tokens)
MIN_SHARED_TOKENS = 16


class PrefixIndex:
    """The internal forest of shared prefix nodes and root twins over one store.

    Args:
        table: the runtime's node table (live roots are the first candidates; owner stamp).
        store: the block store whose blocks are cut.
        policy: told of every cut (``Policy.split_block``) so its per-block state is cut too.
        min_tokens: shortest piece cut out for sharing.
    """

    def __init__(self, table: NodeTable, store: KVStore, policy: Policy, min_tokens: int = MIN_SHARED_TOKENS) -> None:
        self.table, self.store, self.policy, self.min_tokens = table, store, policy, min_tokens
        #: internal nodes by block id: prefix nodes (negative ids) and twins (their root's id)
        self.nodes: dict[int, Node] = {}
        self._next = -1

    # ---- queries -------------------------------------------------------------------------
    def prefix_ids(self) -> list[int]:
        """Block ids of the shared prefix nodes."""
        return [i for i in self.nodes if i < 0]

    def users(self, prefix_id: int) -> int:
        """Trees reading a prefix block (the twins below it)."""
        return sum(1 for n in self.nodes[prefix_id].subtree() if n.id >= 0)

    # ---- attach / release ----------------------------------------------------------------
    def attach(self, ids: Sequence[int]) -> tuple[Node | None, int]:
        """The stored prefix a prompt of ``ids`` should hang below, and its length in tokens.

        Cuts the block where the match ends (when the matching piece is long enough); returns
        (None, 0) when nothing worth sharing is stored.
        """
        ids = list(ids)
        parent, off, candidates = None, 0, self._tops()
        while True:
            best, common = self._longest(candidates, ids, off)
            if best is None:
                break
            own = len(best.token_ids)
            if best.id < 0 and common == own:  # a whole prefix node: go below it
                parent, off, candidates = best, off + common, best.children
                continue
            common = min(common, own - 1) if best.id >= 0 else common  # a root keeps a token of its own
            if common >= self.min_tokens:
                parent, off = self._cut(best, common), off + common
            break
        return parent, off

    def twin(self, root: Node, parent: Node, shared: int) -> Node:
        """The internal twin of a new ``root`` below prefix node ``parent`` (``shared`` tokens)."""
        twin = self._internal(root.id, parent, root.token_ids[shared:], shared, root.tree_id)
        twin.key = root.key
        root.kv = twin
        return twin

    def release(self, root: Node) -> list[int]:
        """A released root (or one whose prefill failed) leaves the forest; returns the prefix
        blocks no tree reads any more (popped from the store, their nodes gone)."""
        twin = root.kv
        if twin is None or self.nodes.get(twin.id) is not twin:
            return []
        del self.nodes[twin.id]
        twin.released = True
        freed, up = [], twin.parent
        if up is not None and twin in up.children:  # a failed prefill's undo already unlinked it
            up.children.remove(twin)
        while up is not None and not up.children:
            if up.id in self.store:
                self.store.pop(up.id)
            del self.nodes[up.id]
            up.released = True
            freed.append(up.id)
            nxt = up.parent
            if nxt is not None:
                nxt.children.remove(up)
            up = nxt
        return freed

    # ---- internals -----------------------------------------------------------------------
    def _tops(self) -> list[Node]:
        """The top of the forest: prefix nodes without a parent, and live roots stored whole."""
        live = self.table.live
        roots = [live[i] for i in self.table.tree_seeds if i in live and live[i].kv is None]
        return [n for n in self.nodes.values() if n.id < 0 and n.parent is None] + roots

    def _longest(self, candidates: Sequence[Node], ids: list[int], off: int) -> tuple[Node | None, int]:
        """The candidate whose (complete, stored) block shares the most tokens with ``ids[off:]``."""
        best, most = None, 0
        limit = len(ids) - 1 - off  # the new root keeps at least its last token
        for node in candidates:
            if not self._complete(node):
                continue
            tokens, n = node.token_ids, 0
            top = min(self._present(node), limit)
            while n < top and tokens[n] == ids[off + n]:
                n += 1
            if n > most:
                best, most = node, n
        return best, most

    def _complete(self, node: Node) -> bool:
        """A block that holds all its tokens' records (not a prompt still being prefilled)."""
        if node.released or node.id not in self.store:
            return False
        blk = self.store.get(node.id)
        if blk.per_head:  # each KV head holds other tokens: no prefix of it is one for every head
            return False
        return blk.length == len(node.token_ids) and (node.id < 0 or blk.next_logits is not None)

    def _present(self, node: Node) -> int:
        """Leading tokens of ``node``'s block held by some tier (a token dropped for good ends what
        can be shared: the new tree would read a prefix that separate trees never lose)."""
        blk = self.store.get(node.id)
        if blk.kept_tokens == blk.length:
            return blk.length
        held = torch.zeros(blk.length, dtype=torch.bool)
        held[blk.kept.cpu()] = True
        host = self.store.host.indices(node.id)
        if host is not None:
            held[host] = True
        missing = torch.nonzero(~held)
        return int(missing[0]) if missing.numel() else blk.length

    def _cut(self, node: Node, at: int) -> Node:
        """Cut ``node``'s block at ``at``: returns the new prefix node (tokens [0, at)) above it."""
        if self.nodes.get(node.id) is not node:  # a public root stored whole: it gets its twin now
            node = self.twin(node, None, 0)
        prefix = self._internal(self._next, None, node.token_ids[:at], node.start_pos, self._next)
        self._next -= 1
        up = node.parent
        if up is not None:  # the prefix takes node's place among its siblings
            up.children[up.children.index(node)] = prefix
            prefix.parent = up
        node.parent = prefix
        prefix.children.append(node)
        node.token_ids, node.start_pos = node.token_ids[at:], node.start_pos + at
        self.store.split(node.id, prefix.id, at)
        self.policy.split_block(node.id, prefix.id, at)
        log.debug("prefix %d: %d tokens cut from block %d", prefix.id, at, node.id)
        return prefix

    def _internal(self, node_id: int, parent: Node | None, ids: list[int], start: int, tree_id: int) -> Node:
        node = Node(id=node_id, parent=parent, token_ids=list(ids), text="", kind=PROMPT, start_pos=start)
        node.owner, node.tree_id = self.table.owner, tree_id
        if parent is not None:
            parent.children.append(node)
        self.nodes[node_id] = node
        return node


class SharingHost(Protocol):
    """What a shared root's prefill needs of the runtime (the :class:`~arbor_runtime.Runtime` is one;
    a protocol, so this module does not import the runtime that imports it)."""

    memory: MemoryManager
    prefixes: PrefixIndex
    prefiller: Prefiller
    table: NodeTable
    store: KVStore
    accounts: Accounts


@dataclass(eq=False, slots=True)
class SharedRootJob:
    """``new_tree``'s work with sharing on (driver thread): attach below the longest stored prefix,
    then prefill only the suffix, over the prefix's KV; it asks for room, and waits, like any prefill.

    Without a prefix worth sharing it is the ordinary prompt prefill. Counts go to the work's
    metrics: ``prefix_trees``, ``prefix_prefill_saved_tokens`` (prompt tokens not prefilled) and
    ``prefix_resident_saved_tokens`` (of those, the ones on the device when the tree attached:
    device KV not stored a second time).
    """

    rt: SharingHost
    ids: list[int]
    text: str
    seed: int
    examples: tuple[int, int] | None = None  # the prompt's few-shot span (``Node.examples``)
    root: Node | None = None
    job: PrefillJob | None = None
    resident: int = 0

    def demand(self) -> tuple[Node | None, int]:
        """(path end, slots) this work still needs: before it starts, a new root of the whole prompt
        (what it may share is found when it starts); then its prefill's demand."""
        if self.job is not None:
            return self.job.demand()
        return None, len(self.ids)

    def check(self) -> None:
        """What its prefill checks before it asks for room again (its parent is live)."""
        if self.job is not None:
            self.job.check()

    def __call__(self) -> Generator[Request, int, Node]:
        if self.job is None:
            self._start()
        if self.root is None:
            return self.job()
        return self._shared(self.job())

    def _shared(self, prefill: Generator[Request, int, Node]) -> Generator[Request, int, Node]:
        """The suffix's prefill below the shared prefix, then the counts of what sharing saved."""
        try:
            yield from prefill
        except GeneratorExit:  # dropped by an engine abort while waiting: left as it was
            raise
        except BaseException:  # the prefill undid the twin's block and the node: drop its prefixes
            self.root.released = True
            self.rt.memory.forget(self.rt.prefixes.release(self.root))
            raise
        shared = self.root.kv.start_pos
        for m in self.rt.accounts.targets():
            m.prefix_trees += 1
            m.prefix_prefill_saved_tokens += shared
            m.prefix_resident_saved_tokens += self.resident
        return self.root

    def _start(self) -> None:
        rt, prefiller = self.rt, self.rt.prefiller
        parent, shared = rt.prefixes.attach(self.ids)
        if parent is None:
            self.job = prefiller.job(None, self.ids, self.text, PROMPT, seed=self.seed, examples=self.examples)
            return
        root = prefiller.new_node(None, self.ids, self.text, PROMPT, 0)
        root.examples = self.examples
        rt.table.tree_seeds[root.id] = self.seed
        twin = rt.prefixes.twin(root, parent, shared)
        rt.memory.begin([], rt.accounts.work.account)
        self.resident = sum(rt.store.get(n.id).kept_tokens for n in parent.path())
        self.root = root
        self.job = PrefillJob(prefiller, parent, twin.token_ids, self.text, PROMPT, seed=self.seed, node=twin)
