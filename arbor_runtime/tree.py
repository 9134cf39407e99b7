"""The search tree: nodes own thought blocks (token ids, text, per-token stats), and the arithmetic
of their paths (which blocks a piece of work reads, how many tokens). No tensors here.

Block KV lives in the KV store, keyed by ``node.id``; a node's residency is derived from the
store, never stored twice.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

#: how a block came to be
PROMPT, GENERATED, FORCED = "prompt", "generated", "forced"

#: (path end, or None for a new root not prefilled yet; slots) of one piece of work
Entry = tuple["Node | None", int]


@dataclass(eq=False, slots=True)
class Node:
    """One thought block in the search tree.

    Attributes:
        id: unique within its runtime.
        parent: None for a root.
        token_ids: the block's tokens (its KV covers exactly these).
        text: the block's decoded text.
        kind: "prompt" (root), "generated" (sampled) or "forced" (teacher-forced ``append``).
        logprobs: per-token log-probability under the model (raw distribution, no temperature);
            empty for a prompt block.
        entropies: per-token entropy (nats) of the distribution each token was drawn from.
        start_pos: position id of the block's first token (= tokens on the path before it).
        stop_reason: "stop" (a stop string), "eos", "length" for generated blocks; "" otherwise.
        value: the search value a controller set (``Runtime.set_value``), None until then.
        meta: free-form fields controllers and tasks attach (state, scores, ...).
        key: 64-bit digest of the path's token ids (root to this node); sampling streams are
            seeded from it, so what a node's children sample depends on its content, not on
            node ids or on what else the runtime was doing.
        tree_id: id of the root of this node's tree.
        spawned: children ever requested under this node (released ones included).
        owner: identity of the runtime that made the node (its ``Runtime.owner``); a runtime
            refuses nodes of another (node ids are only unique within one runtime).
        kv: for a root whose prompt begins with a prefix stored once for several trees, the
            runtime's internal twin of this root (same id): its block holds only the prompt's
            suffix and its parent chain the shared prefix blocks (see ``arbor_runtime.prefix``);
            None otherwise. The public view (``parent``, ``path()``, ``token_ids``) is unchanged.
        examples: for a root, the token span [start, end) of its prompt that holds few-shot
            examples (``Runtime.new_tree(examples=...)``); below a tree-aware policy's floor those
            tokens are token-extracted by value while the rest of the prompt (instruction, question)
            stays on the device as long as room allows. None: not marked (only the sinks are kept).
    """

    id: int
    parent: Node | None
    token_ids: list[int]
    text: str
    kind: str
    start_pos: int
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    stop_reason: str = ""
    value: float | None = None
    children: list[Node] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    released: bool = False
    key: int = 0
    tree_id: int = 0
    spawned: int = 0
    owner: object = field(default=None, repr=False)
    kv: Node | None = field(default=None, repr=False)
    examples: tuple[int, int] | None = field(default=None, repr=False)

    @property
    def depth(self) -> int:
        """Blocks above this one (root: 0)."""
        return 0 if self.parent is None else self.parent.depth + 1

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def end_pos(self) -> int:
        """Position id the next token after this block gets (= path length in tokens)."""
        return self.start_pos + len(self.token_ids)

    @property
    def root(self) -> Node:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    @property
    def mean_logprob(self) -> float:
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else 0.0

    @property
    def mean_entropy(self) -> float:
        return sum(self.entropies) / len(self.entropies) if self.entropies else 0.0

    @staticmethod
    def path_key(parent: Node | None, token_ids: list[int]) -> int:
        """The ``key`` of a node with these tokens under ``parent`` (stable across runs and machines)."""
        digest = hashlib.blake2b(digest_size=8)
        digest.update((parent.key if parent is not None else 0).to_bytes(8, "little"))
        digest.update(array("q", token_ids).tobytes())
        return int.from_bytes(digest.digest(), "little")

    def path(self) -> list[Node]:
        """Nodes from the root down to this one."""
        nodes: list[Node] = []
        node: Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def kv_path(self) -> list[Node]:
        """The blocks this node's KV attends over, root side first: :meth:`path`, with a root's
        internal twin chain (the shared prefix blocks, then the root's own suffix block) in place of
        the root. What the runtime reads, plans and restores by; users see :meth:`path`."""
        path = self.path()
        twin = path[0].kv
        return path if twin is None else twin.path() + path[1:]

    def subtree(self) -> Iterator[Node]:
        """This node and all its descendants, parents before children."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def __repr__(self) -> str:
        return f"Node(id={self.id}, depth={self.depth}, kind={self.kind}, len={self.length}, text={self.text!r:.40})"


# ---- paths -------------------------------------------------------------------------------
def path_ids(ends: Iterable[Node]) -> set[int]:
    """Ids of every block on the KV paths to ``ends`` (root to end inclusive, shared prefix blocks too)."""
    return {n.id for end in ends for n in end.kv_path()}


def ordered_path_nodes(ends: Sequence[Node], active: frozenset[int]) -> list[Node]:
    """Active blocks on the KV paths to ``ends`` (shared prefixes too), parents before children."""
    seen: dict[int, tuple[int, Node]] = {}
    for end in ends:
        for depth, n in enumerate(end.kv_path()):
            if n.id in active:
                seen[n.id] = (depth, n)
    return [n for _, n in sorted(seen.values(), key=lambda dn: (dn[0], dn[1].id))]


def demand_tokens(entries: Iterable[Entry]) -> int:
    """Device slots the work needs together: every block on the union of their KV paths (counted
    once, whole: a policy that keeps the active path whole holds all of it; a prompt prefix that
    several trees share is one block of the shared length, ``Node.kv_path``) plus each entry's own
    slots."""
    seen: dict[int, int] = {}
    slots = 0
    for end, n in entries:
        slots += n
        if end is not None and not end.released:
            for node in end.kv_path():
                seen[node.id] = node.length
    return sum(seen.values()) + slots
