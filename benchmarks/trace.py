"""Search traces: a recorded ``full`` search as plain JSON (tree, token ids, op order, events).

A trace holds everything needed to rebuild the same tree, in the same order, on a fresh
runtime under any policy: the runtime's ``oplog`` (every public operation with node ids), every
node's token ids, kind, text and recorded per-token log-probabilities, the expansion order, the
event log and the per-operation memory trace of the recording. It is JSON, never pickle.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from arbor_runtime import Runtime
from arbor_runtime.loading import LoadedModel

TRACE_VERSION = 1


@dataclass(slots=True)
class TraceNode:
    """One recorded block. ``logprobs`` are the recorded per-token log-probs (empty for a root)."""

    id: int
    parent: int | None
    kind: str
    token_ids: list[int]
    text: str
    start_pos: int
    logprobs: list[float] = field(default_factory=list)
    value: float | None = None
    released: bool = False

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


class ReplayOp(NamedTuple):
    """One runtime call of a replay: ``op`` is "new_tree" | "append" | "release" | "set_value" | "compress".

    ``node`` is the target (the new root for new_tree), ``child`` the block an append creates,
    ``source`` the index of the recorded oplog entry it comes from (an expand of k children
    becomes k appends with the same source).
    """

    op: str
    node: int
    child: int | None = None
    value: float | None = None
    source: int = 0


@dataclass(slots=True)
class Trace:
    """A recorded search. Build with :func:`record_trace`; save/load with :meth:`save` / :func:`load_trace`.

    Attributes:
        model: the model spec the search ran on.
        oplog: the runtime's public operations in call order (see ``Runtime.oplog``).
        nodes: every block ever created (released ones too), by id.
        expansions: node ids in expansion order (one entry per expand request).
        events: the recording's event log (one dict per record).
        memory: the recording's per-operation memory trace (``TracePoint`` dicts).
        metrics: the recording's ``RuntimeMetrics.to_dict()``.
        meta: free-form description (task, problem, controller, seed, result, date).
    """

    model: str
    oplog: list[dict[str, Any]]
    nodes: dict[int, TraceNode]
    expansions: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = TRACE_VERSION

    # ---- views ---------------------------------------------------------------------------
    @property
    def roots(self) -> list[TraceNode]:
        return [n for n in self.nodes.values() if n.parent is None]

    @property
    def prompt_text(self) -> str:
        """Text of the first root (the search prompt)."""
        return self.roots[0].text

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.roots[0].token_ids)

    @property
    def total_tokens(self) -> int:
        """Tokens over all blocks (each is computed once by the runtime)."""
        return sum(len(n.token_ids) for n in self.nodes.values())

    @property
    def scored_positions(self) -> int:
        """Positions a replay scores: every token of every non-root block."""
        return sum(len(n.token_ids) for n in self.nodes.values() if n.parent is not None)

    def path(self, node_id: int) -> list[TraceNode]:
        """Blocks from the root down to ``node_id``."""
        out, cur = [], self.nodes[node_id]
        while True:
            out.append(cur)
            if cur.parent is None:
                return out[::-1]
            cur = self.nodes[cur.parent]

    def path_ids(self, node_id: int) -> list[int]:
        return [t for n in self.path(node_id) for t in n.token_ids]

    def replay_ops(self) -> Iterator[ReplayOp]:
        """The recorded operations as teacher-forced runtime calls, in the recorded order.

        An ``expand`` of several requests becomes one ``append`` per child, request by request,
        children in their recorded order.
        """
        for i, op in enumerate(self.oplog):
            kind = op["op"]
            if kind == "new_tree":
                yield ReplayOp("new_tree", op["node"], source=i)
            elif kind == "expand":
                for (parent, _), kids in zip(op["requests"], op["children"], strict=True):
                    for kid in kids:
                        yield ReplayOp("append", parent, kid, source=i)
            elif kind == "append":
                yield ReplayOp("append", op["node"], op["child"], source=i)
            elif kind == "release":
                yield ReplayOp("release", op["node"], source=i)
            elif kind == "set_value":
                yield ReplayOp("set_value", op["node"], value=op["value"], source=i)
            elif kind == "compress":
                yield ReplayOp("compress", -1, value=op["target"], source=i)
            else:
                raise ValueError(f"trace oplog entry {i} has unknown op {kind!r}")

    def expand_groups(self) -> list[tuple[int, list[int]]]:
        """(parent, children) in creation order: one group per expand request or append."""
        groups = []
        for op in self.oplog:
            if op["op"] == "expand":
                groups += [
                    (parent, list(kids)) for (parent, _), kids in zip(op["requests"], op["children"], strict=True)
                ]
            elif op["op"] == "append":
                groups.append((op["node"], [op["child"]]))
        return groups

    def full_replay_peak(self) -> int:
        """Peak resident device KV tokens of a teacher-forced replay under ``full`` (no model needed).

        Under ``full`` resident = tokens of live blocks; an append needs room for its own block.
        """
        kids: dict[int, list[int]] = {}
        for n in self.nodes.values():
            if n.parent is not None:
                kids.setdefault(n.parent, []).append(n.id)
        live: dict[int, int] = {}
        resident = peak = 0
        for op in self.replay_ops():
            if op.op in ("new_tree", "append"):
                new = op.node if op.op == "new_tree" else op.child
                live[new] = len(self.nodes[new].token_ids)
                resident += live[new]
                peak = max(peak, resident)
            elif op.op == "release":
                stack = [op.node]
                while stack:
                    cur = stack.pop()
                    resident -= live.pop(cur, 0)
                    stack.extend(kids.get(cur, []))
        return peak

    # ---- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["nodes"] = [asdict(n) for n in self.nodes.values()]
        return out

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict()) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        version = data.get("version")
        if version != TRACE_VERSION:
            raise ValueError(f"trace version {version!r} is not supported; valid: {TRACE_VERSION}")
        nodes = {int(n["id"]): TraceNode(**n) for n in data["nodes"]}
        fields = {k: data[k] for k in ("model", "oplog", "expansions", "events", "memory", "metrics", "meta")}
        return cls(nodes=nodes, version=version, **fields)

    @classmethod
    def from_runtime(cls, rt: Runtime, model: str, meta: dict[str, Any] | None = None) -> Trace:
        """Snapshot a runtime that ran a search (its oplog, all nodes, events, memory trace)."""
        nodes = {
            n.id: TraceNode(
                id=n.id,
                parent=None if n.parent is None else n.parent.id,
                kind=n.kind,
                token_ids=list(n.token_ids),
                text=n.text,
                start_pos=n.start_pos,
                logprobs=[float(x) for x in n.logprobs],
                value=n.value,
                released=n.released,
            )
            for n in rt.all_nodes.values()
        }
        expansions = [node for op in rt.oplog if op["op"] == "expand" for node, _ in op["requests"]]
        return cls(
            model=model,
            oplog=json.loads(json.dumps(rt.oplog)),
            nodes=nodes,
            expansions=expansions,
            events=json.loads(json.dumps([asdict(r) for r in rt.events.records])),  # tuples -> lists
            memory=[asdict(p) for p in rt.metrics.trace],
            metrics=rt.metrics.to_dict(),
            meta=dict(meta or {}),
        )


def load_trace(path: str | Path) -> Trace:
    """Read a trace written by :meth:`Trace.save`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file {str(path)!r} does not exist")
    return Trace.from_dict(json.loads(path.read_text()))


def record_trace(
    loaded: LoadedModel, search: Callable[[Runtime], Any], seed: int = 0, meta: dict[str, Any] | None = None
) -> Trace:
    """Run ``search(rt)`` on a fresh ``full`` runtime without budget and return its trace.

    ``search`` is anything that grows a tree through the public API, e.g.
    ``lambda rt: BFSController(rt, task, verifier).solve(problem)``. When it returns a
    ``SearchResult``, its solved flag and answer go into ``meta``.
    """
    rt = Runtime(loaded, policy="full", seed=seed)
    result = search(rt)
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    # the weight format it ran with: a replay loads the same one (benchmarks/cli.py), or its tokens would differ
    meta = {"seed": seed, "created": created, "weights": loaded.weights, **(meta or {})}
    for key in ("solved", "answer", "steps", "off_path_expansions"):
        if hasattr(result, key):
            meta[key] = getattr(result, key)
    if not rt.oplog:
        raise ValueError("the search made no runtime calls: nothing to record")
    return Trace.from_runtime(rt, loaded.spec, meta)
