"""Search trees as files and in the terminal: ``trees/<index>.json`` and ``.graphml`` per problem.

One flat record per node (the JSON schema; GraphML gets the same fields with nulls replaced and
``meta`` flattened to ``meta_<key>`` strings):

    id, parent, kind, text, tokens, start_pos, depth, value, expansion (first position in the
    controller's expansion order), stop_reason, mean_logprob, best (on the best path), released,
    kv_device / kv_host / kv_dropped (``Runtime.residency`` at the end of the search), meta.

Released (pruned) nodes leave ``Runtime.nodes`` and their parent's ``children``, but the runtime
keeps every node it created in ``Runtime.all_nodes``, so the export holds them all (flagged
``released``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
from rich.console import Group
from rich.text import Text
from rich.tree import Tree

from arbor_cli.results import TREES_DIR
from arbor_runtime import Node, Runtime

SCALARS = (bool, int, float, str)


# ---- collecting ----------------------------------------------------------------------------
def collect_nodes(rt: Runtime, root: Node) -> list[Node]:
    """Every node of ``root``'s tree ever created (released ones too), by id.

    Other trees in the runtime (an LLM verifier's prompt prefix) are left out.
    """
    return sorted((n for n in rt.all_nodes.values() if n.tree_id == root.id), key=lambda n: n.id)


def search_root(rt: Runtime, best: Node | None, expansions: Sequence[int]) -> Node | None:
    """The root of the search: the best node's, else the first expanded node's, else the runtime's first root."""
    first = best or (rt.all_nodes.get(expansions[0]) if expansions else None)
    if first is not None:
        return first.root
    roots = [n for n in rt.all_nodes.values() if n.parent is None]
    return min(roots, key=lambda n: n.id) if roots else None


# ---- the record ----------------------------------------------------------------------------
def tree_record(
    rt: Runtime,
    best: Node | None,
    expansions: Sequence[int],
    root: Node | None = None,
    guess_root: bool = True,
    **info: Any,
) -> dict[str, Any]:
    """The JSON-ready tree of one search.

    Args:
        rt: the runtime after the search.
        best: the node ending the best path, or None.
        expansions: expanded node ids in expansion order (``SearchResult.expansions``).
        root: the search's root (default: found from ``best`` or the first expansion).
        guess_root: without ``root``, look for it (:func:`search_root`); False in a shared runtime,
            where the first root may be another search's (the record then has no nodes).
        **info: top-level fields to add (``index``, ``question``, ...).
    """
    if root is None and guess_root:
        root = search_root(rt, best, expansions)
    nodes = collect_nodes(rt, root) if root is not None else []
    on_best = {n.id for n in best.path()} if best is not None else set()
    order: dict[int, int] = {}
    for pos, node_id in enumerate(expansions):
        order.setdefault(node_id, pos)
    return info | {
        "best": best.id if best is not None else None,
        "expansions": list(expansions),
        "nodes": [node_record(rt, n, n.id in on_best, order.get(n.id)) for n in nodes],
    }


def node_record(rt: Runtime, node: Node, best: bool, expansion: int | None) -> dict[str, Any]:
    """One node's fields (see the module docstring)."""
    kv = rt.residency(node)
    return {
        "id": node.id,
        "parent": node.parent.id if node.parent is not None else None,
        "kind": node.kind,
        "text": node.text,
        "tokens": node.length,
        "start_pos": node.start_pos,
        "depth": node.depth,
        "value": node.value,
        "expansion": expansion,
        "stop_reason": node.stop_reason,
        "mean_logprob": node.mean_logprob,
        "best": best,
        "released": node.released,
        "kv_device": kv["device"],
        "kv_host": kv["host"],
        "kv_dropped": kv["dropped"],
        "meta": {k: _jsonable(v) for k, v in node.meta.items()},
    }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, SCALARS):
        return value
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (list, tuple)) and all(isinstance(v, SCALARS) for v in value):
        return list(value)
    return str(value)


# ---- GraphML -------------------------------------------------------------------------------
#: GraphML has no null: what each nullable field becomes
GRAPHML_NULLS = {"parent": -1, "value": -1.0, "expansion": -1, "best": -1}


def to_graph(record: Mapping[str, Any]) -> nx.DiGraph:
    """The record as a directed graph (parent -> child); every attribute a GraphML scalar."""
    graph = nx.DiGraph()
    for key, value in record.items():
        if key == "nodes":
            continue
        value = GRAPHML_NULLS.get(key, "") if value is None else value
        graph.graph[key] = value if isinstance(value, SCALARS) else json.dumps(value)
    for rec in record["nodes"]:
        attrs = {k: (GRAPHML_NULLS.get(k, "") if v is None else v) for k, v in rec.items() if k != "meta"}
        attrs["value"] = float(attrs["value"])
        for k, v in rec["meta"].items():
            attrs[f"meta_{k}"] = v if isinstance(v, str) else json.dumps(v)
        graph.add_node(rec["id"], **attrs)
    ids = {rec["id"] for rec in record["nodes"]}
    graph.add_edges_from((rec["parent"], rec["id"]) for rec in record["nodes"] if rec["parent"] in ids)
    return graph


# ---- files ---------------------------------------------------------------------------------
def tree_paths(run_dir: Path, index: int) -> tuple[Path, Path]:
    """``trees/<index>.json`` and ``trees/<index>.graphml`` of a run dir."""
    base = Path(run_dir) / TREES_DIR / str(index)
    return base.with_suffix(".json"), base.with_suffix(".graphml")


def write_tree(run_dir: Path, index: int, record: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write one problem's tree as JSON and GraphML; returns both paths."""
    json_path, graphml_path = tree_paths(run_dir, index)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    nx.write_graphml(to_graph(record), graphml_path)
    return json_path, graphml_path


def load_tree(run_dir: Path, index: int) -> dict[str, Any] | None:
    """A tree written by :func:`write_tree`, or None when that problem has none."""
    path = tree_paths(run_dir, index)[0]
    return json.loads(path.read_text()) if path.is_file() else None


# ---- terminal ------------------------------------------------------------------------------
LEGEND = "KV at the end: ● device  ◐ split (d device/h host/x dropped tokens)  ○ host  ✗ gone"


def render_tree(record: Mapping[str, Any], width: int = 48) -> Group:
    """The best path, then the whole tree (best path in bold green, released nodes dim), for ``Console.print``."""
    by_id = {rec["id"]: rec for rec in record["nodes"]}
    kids: dict[int | None, list[dict[str, Any]]] = {}
    for rec in record["nodes"]:
        parent = rec["parent"] if rec["parent"] in by_id else None
        kids.setdefault(parent, []).append(rec)
    title = Text(f"problem {record.get('index', '?')}", style="bold")
    if record.get("question"):
        title.append(f": {record['question']}", style="bold")
    trees = []
    for root in kids.get(None, []):
        tree = Tree(_label(root, width))
        stack = [(tree, root)]
        while stack:
            branch, rec = stack.pop()
            for child in kids.get(rec["id"], []):
                stack.append((branch.add(_label(child, width)), child))
        trees.append(tree)
    return Group(title, _best_path(record, by_id), *trees, Text(LEGEND, style="dim"))


def _best_path(record: Mapping[str, Any], by_id: Mapping[int, dict[str, Any]]) -> Text:
    if record.get("best") is None:
        return Text("best path: none (no terminal reached)", style="yellow")
    path, node_id = [], record["best"]
    while node_id is not None and node_id in by_id:
        path.append(by_id[node_id])
        node_id = by_id[node_id]["parent"]
    text = "".join(rec["text"] for rec in reversed(path) if rec["parent"] is not None).strip()
    return Text("best path:\n  " + text.replace("\n", "\n  "), style="bold green")


def _label(rec: Mapping[str, Any], width: int) -> Text:
    text = rec["text"].replace("\n", "⏎")
    text = text if len(text) <= width else text[: width - 1] + "…"
    if rec["kind"] == "prompt":
        text = f"prompt, {rec['tokens']} tokens"
    value = "" if rec["value"] is None else f" v={rec['value']:.2f}"
    style = "bold green" if rec["best"] else ("dim" if rec["released"] else "")
    label = Text(f"{_marker(rec)} #{rec['id']} ", style=style)
    label.append(repr(text) if rec["kind"] != "prompt" else text, style=style)
    label.append(value + (f" [exp {rec['expansion']}]" if rec["expansion"] is not None else ""), style="cyan")
    if rec["meta"].get("valid") is False:
        label.append(" invalid", style="red")
    return label


def _marker(rec: Mapping[str, Any]) -> str:
    device, host, dropped, tokens = rec["kv_device"], rec["kv_host"], rec["kv_dropped"], rec["tokens"]
    if device == tokens:
        return "●"
    if host == tokens:
        return "○"
    if dropped == tokens:
        return "✗"
    return f"◐ {device}d/{host}h/{dropped}x"
