"""The node table: every node a runtime made, live or released, and how nodes come and go.

Pure bookkeeping over :class:`~arbor_runtime.tree.Node` (no model, no device): ids in creation
order, the owner stamp that tells this runtime's nodes from another's, each tree's sampling seed,
and the live / all tables that the memory manager and the tests read. The block store is touched
only to forget a released subtree's KV. Counts (``nodes_created`` / ``nodes_released``) go to the
metrics the caller passes (the runtime's, and the current account's).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence

from arbor_runtime.errors import NodeError
from arbor_runtime.kv import KVStore
from arbor_runtime.metrics import RuntimeMetrics
from arbor_runtime.tree import Node


class RuntimeOwner:
    """The identity a runtime stamps on every node it makes (``Node.owner``).

    A token rather than the runtime itself: a node can be pickled or copied on its own without
    dragging the model along. A deep copy of a runtime gets a fresh one, shared by the copy's nodes.
    """


class NodeTable:
    """A runtime's nodes by id: ``live`` (not released) and ``all`` (released ones too), in id order.

    Args:
        store: the block store whose entries a released subtree gives up.
        seed: the default seed of a tree's sampling streams (a tree may set its own).
    """

    def __init__(self, store: KVStore, seed: int = 0) -> None:
        self.store = store
        #: stamped on every node made here; nodes carrying another are refused (NodeError)
        self.owner = RuntimeOwner()
        self.live: dict[int, Node] = {}  # live nodes (shared with the memory manager)
        self.all: dict[int, Node] = {}  # every node ever created, released ones too
        self.seed = seed
        self.tree_seeds: dict[int, int] = {}  # root id -> the seed of that tree's sampling streams
        self.next = 0  # the id the next node gets
        self._ids = threading.Lock()

    def __deepcopy__(self, memo: dict) -> NodeTable:
        """A copy of every table (through ``memo``, so the copy's nodes and store are the runtime copy's),
        with a fresh owner stamp (copied like the rest) and its own id lock."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            setattr(clone, name, threading.Lock() if name == "_ids" else copy.deepcopy(value, memo))
        return clone

    def next_id(self) -> int:
        """A fresh node id (any thread may ask: rows reserve their child's id when admitted)."""
        with self._ids:
            self.next += 1
            return self.next - 1

    def new(
        self,
        parent: Node | None,
        ids: list[int],
        text: str,
        kind: str,
        start_pos: int,
        counts: Sequence[RuntimeMetrics],
        node_id: int | None = None,
    ) -> Node:
        """A node for a new block under ``parent`` (None: a root), entered in both tables."""
        node_id = self.next_id() if node_id is None else node_id
        node = Node(id=node_id, parent=parent, token_ids=list(ids), text=text, kind=kind, start_pos=start_pos)
        node.key = Node.path_key(parent, node.token_ids)
        node.owner = self.owner
        node.tree_id = node.id if parent is None else parent.tree_id
        self.live[node.id] = node
        self.all[node.id] = node
        if parent is not None:
            parent.children.insert(sum(c.id < node.id for c in parent.children), node)
        for m in counts:
            m.nodes_created += 1
        return node

    def discard(self, node: Node, counts: Sequence[RuntimeMetrics]) -> None:
        """A node whose operation failed (already forgotten): gone as if never created."""
        self.all.pop(node.id, None)
        for m in counts:
            m.nodes_created -= 1
            m.nodes_released -= 1

    def check(self, node: Node) -> None:
        """``node`` is one this runtime made (released or not), else NodeError (node ids are per runtime)."""
        if not isinstance(node, Node):
            raise NodeError(f"expected a Node this Runtime returned, got {type(node).__name__} {node!r:.60}")
        if node.owner is not self.owner:
            whose = "no Runtime (built by hand)" if node.owner is None else "another Runtime"
            raise NodeError(f"{node!r} belongs to {whose}; pass nodes this Runtime returned")

    def check_live(self, node: Node) -> None:
        """``node`` is this runtime's and not released (it has KV to build on), else NodeError."""
        self.check(node)
        if node.released:
            raise NodeError(f"{node!r} was released; its KV is gone and it cannot be used for new work")

    def tree_seed(self, node: Node) -> int:
        """The seed of ``node``'s tree's sampling streams."""
        self.check(node)
        return self.tree_seeds.get(node.tree_id, self.seed)

    def forget_subtree(self, node: Node, counts: Sequence[RuntimeMetrics]) -> list[int]:
        """Release ``node``'s subtree from the store and the live table; returns the ids."""
        gone = []
        for sub in list(node.subtree()):
            if sub.id in self.store:
                self.store.pop(sub.id)
            sub.released = True
            self.live.pop(sub.id, None)
            gone.append(sub.id)
            for m in counts:
                m.nodes_released += 1
        if node.parent is not None and node in node.parent.children:
            node.parent.children.remove(node)
        return gone

    def order(self, created: list[Node]) -> None:
        """Children finish in any order; keep both tables in id (creation) order."""
        for node in sorted(created, key=lambda n: n.id):
            for table in (self.live, self.all):
                if node.id in table:
                    table[node.id] = table.pop(node.id)
