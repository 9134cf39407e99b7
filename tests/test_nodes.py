"""The node table on its own (no model): ids, the owner stamp, counts, release and order, copies."""

from __future__ import annotations

import copy

import pytest

from arbor_runtime.errors import NodeError
from arbor_runtime.metrics import RuntimeMetrics
from arbor_runtime.nodes import NodeTable
from arbor_runtime.tree import FORCED, GENERATED, PROMPT, Node


def table_with_tree() -> tuple[NodeTable, dict, RuntimeMetrics, list[Node]]:
    """A root (3 tokens) with two children; the store is a plain dict (``in`` and ``pop`` are all it needs)."""
    store: dict = {}
    table, m = NodeTable(store, seed=7), RuntimeMetrics()
    root = table.new(None, [1, 2, 3], "r", PROMPT, 0, [m])
    kids = [table.new(root, [4 + i], f"k{i}", GENERATED, root.end_pos, [m]) for i in range(2)]
    for node in (root, *kids):
        store[node.id] = "kv"
    return table, store, m, [root, *kids]


def test_ids_owner_tree_and_counts():
    table, _, m, (root, a, b) = table_with_tree()
    assert [root.id, a.id, b.id] == [0, 1, 2] and table.next == 3
    assert a.parent is root and root.children == [a, b] and a.tree_id == b.tree_id == root.id
    assert all(n.owner is table.owner for n in (root, a, b))
    assert list(table.live) == list(table.all) == [0, 1, 2]
    assert m.nodes_created == 3 and a.start_pos == 3
    assert table.tree_seed(a) == 7
    table.tree_seeds[root.id] = 11
    assert table.tree_seed(b) == 11


def test_a_reserved_id_keeps_its_place_among_the_children():
    table, _, m, (root, a, b) = table_with_tree()
    reserved = table.next_id()  # a row reserves its child's id when admitted; the child comes later
    later = table.new(root, [9], "x", FORCED, root.end_pos, [m])
    early = table.new(root, [8], "y", GENERATED, root.end_pos, [m], node_id=reserved)
    assert [c.id for c in root.children] == [a.id, b.id, early.id, later.id]
    assert list(table.live) == [0, 1, 2, later.id, early.id]
    table.order([later, early])
    assert list(table.live) == list(table.all) == [0, 1, 2, early.id, later.id]


def test_foreign_and_released_nodes_are_refused():
    table, _, m, (root, a, _) = table_with_tree()
    *_, (foreign, *_) = table_with_tree()
    with pytest.raises(NodeError, match="another Runtime"):
        table.check(foreign)
    with pytest.raises(NodeError, match="built by hand"):
        table.check(Node(id=0, parent=None, token_ids=[1], text="", kind=PROMPT, start_pos=0))
    with pytest.raises(NodeError, match="expected a Node"):
        table.check("root")
    table.forget_subtree(a, [m])
    table.check(a)  # released: still this table's (readable)
    with pytest.raises(NodeError, match="was released"):
        table.check_live(a)
    table.check_live(root)


def test_forget_subtree_and_discard():
    table, store, m, (root, a, b) = table_with_tree()
    grand = table.new(a, [5], "g", GENERATED, a.end_pos, [m])
    store[grand.id] = "kv"
    gone = table.forget_subtree(a, [m])
    assert sorted(gone) == [a.id, grand.id] and a.released and grand.released
    assert root.children == [b] and set(table.live) == {root.id, b.id} and set(store) == {root.id, b.id}
    assert len(table.all) == 4 and m.nodes_released == 2
    table.discard(grand, [m])  # its operation failed: as if never created
    assert grand.id not in table.all and m.nodes_created == 3 and m.nodes_released == 1


def test_a_copy_has_its_own_nodes_owner_and_id_lock():
    table, _, m, (root, *_) = table_with_tree()
    clone = copy.deepcopy(table)
    assert clone.owner is not table.owner and clone.live[root.id] is not root
    assert all(n.owner is clone.owner for n in clone.all.values())
    assert clone._ids is not table._ids and clone.next_id() == table.next_id() == 3
    clone.check_live(clone.live[root.id])
    with pytest.raises(NodeError, match="another Runtime"):
        clone.check(root)
