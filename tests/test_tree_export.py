"""Tree output: JSON and GraphML per problem, released nodes, best-path flags, show_tree, extra scalars in rows."""

from __future__ import annotations

import json
from types import SimpleNamespace

import networkx as nx
import pytest
from rich.console import Console
from synthetic_data import game24_puzzles

from arbor_cli.build import build, compose_config
from arbor_cli.run import run
from arbor_cli.runners.search import search_one
from arbor_cli.tree_export import load_tree, render_tree, tree_record, write_tree
from arbor_runtime import Runtime, SamplingParams

FIELDS = {
    "id", "parent", "kind", "text", "tokens", "start_pos", "depth", "value", "expansion", "stop_reason",
    "mean_logprob", "best", "released", "kv_device", "kv_host", "kv_dropped", "meta",
}  # fmt: skip


def compose_cfg(data_dir, run_dir, *overrides: str):
    return compose_config(["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={run_dir}", *overrides])


@pytest.fixture
def grown(tiny):
    """root -> 3 thoughts; thought 0 -> forced "Answer: " -> 2 thoughts; thought 1 released. Best: the first leaf.

    A second tree in the same runtime (like an LLM verifier's prompt prefix) is not part of the export."""
    rt = Runtime(tiny, policy="full")
    params = SamplingParams(max_new_tokens=4, temperature=0.7, seed=0)
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    kids = rt.expand(root, n=3, sampling=params)
    forced = rt.append(kids[0], "Answer: ")
    leaves = rt.expand(forced, n=2, sampling=params)
    rt.set_value(kids[0], 0.9)
    kids[0].meta.update(valid=True, state=SimpleNamespace(to_json=lambda: {"left": ["24"]}))
    rt.release(kids[1])
    rt.expand(rt.new_tree("Evaluate: 4 4 6 8\n"), n=1, sampling=params)  # another tree (an LLM verifier's prefix)
    return SimpleNamespace(rt=rt, root=root, kids=kids, forced=forced, leaves=leaves, best=leaves[0])


def test_tree_json_and_graphml_hold_every_node_with_flags(grown, tmp_path):
    g = grown
    record = tree_record(g.rt, g.best, [g.root.id, g.forced.id], index=7, question="4 4 6 8")
    json_path, graphml_path = write_tree(tmp_path, 7, record)
    assert (json_path.name, graphml_path.name) == ("7.json", "7.graphml")
    data = json.loads(json_path.read_text())
    assert data["index"] == 7 and data["best"] == g.best.id
    nodes = {n["id"]: n for n in data["nodes"]}
    assert len(nodes) == 7 and all(set(n) == FIELDS for n in nodes.values())  # released kids[1] included
    on_path = {g.root.id, g.kids[0].id, g.forced.id, g.best.id}
    assert {i for i, n in nodes.items() if n["best"]} == on_path
    released = nodes[g.kids[1].id]
    assert released["released"] and released["kv_device"] == 0 and released["kv_dropped"] == released["tokens"]
    live = nodes[g.kids[0].id]
    assert live["kv_device"] == live["tokens"] == g.kids[0].length and live["value"] == pytest.approx(0.9)
    assert live["meta"] == {"valid": True, "state": {"left": ["24"]}}
    assert nodes[g.root.id]["expansion"] == 0 and nodes[g.forced.id]["expansion"] == 1 and live["expansion"] is None
    assert nodes[g.forced.id]["kind"] == "forced" and nodes[g.best.id]["depth"] == 3
    assert nodes[g.best.id]["parent"] == g.forced.id and nodes[g.root.id]["parent"] is None

    graph = nx.read_graphml(graphml_path)
    assert graph.number_of_nodes() == 7 and graph.number_of_edges() == 6
    assert graph.graph["best"] == g.best.id and graph.graph["question"] == "4 4 6 8"
    root = graph.nodes[str(g.root.id)]
    assert root["parent"] == -1 and root["value"] == -1.0 and root["expansion"] == 0 and root["best"] is True
    assert graph.nodes[str(g.kids[0].id)]["meta_state"] == '{"left": ["24"]}'
    assert graph.has_edge(str(g.forced.id), str(g.best.id))


def test_render_tree_shows_the_best_path(grown):
    g = grown
    record = tree_record(g.rt, g.best, [g.root.id], index=3, question="4 4 6 8")
    console = Console(record=True, width=200)
    console.print(render_tree(record))
    out = console.export_text()
    best_text = (g.kids[0].text + "Answer: " + g.best.text).strip()
    assert "problem 3: 4 4 6 8" in out and "best path:" in out
    assert best_text.splitlines()[0] in out
    assert f"#{g.kids[1].id} " in out and "✗" in out  # the released node, marked gone
    assert out.count("#") >= 7


def test_cli_writes_trees_shows_them_and_puts_extra_scalars_in_rows(data_dir, tmp_path):
    over = (data_dir, tmp_path, "task.start=900", "task.end=901", "controller=dfs", "show_tree=true")
    console = Console(record=True, width=200)
    assert run(compose_cfg(*over), console=console) == 0
    row = json.loads((tmp_path / "results.jsonl").read_text())
    assert isinstance(row["backtracks"], int) and isinstance(row["visits"], int)  # dfs SearchResult.extra
    tree = load_tree(tmp_path, 900)
    assert tree["index"] == 900 and tree["nodes"][0]["kind"] == "prompt"
    # released nodes included; the verifier's value prefix (llm_value, a tree of its own) is counted in
    # nodes_created but not exported with the search tree
    value_prefix = 1 if row["verifier_calls"] else 0
    assert len(tree["nodes"]) == row["nodes_created"] - value_prefix
    assert nx.read_graphml(tmp_path / "trees" / "900.graphml").number_of_nodes() == len(tree["nodes"])
    assert f"problem 900: {' '.join(map(str, game24_puzzles()[900]))}" in console.export_text()
    # resumed problems are shown from their saved tree
    console = Console(record=True, width=200)
    assert run(compose_cfg(*over), console=console) == 0
    assert "problem 900" in console.export_text() and len((tmp_path / "results.jsonl").read_text().splitlines()) == 1


def test_non_scalar_extra_is_left_out_of_the_row(tiny, data_dir, tmp_path):
    setup = build(compose_cfg(data_dir, tmp_path, "task.end=901", "controller=mcts", "controller.iterations=2"), tiny)
    task = setup.task
    solved = search_one(setup, task.problems()[0])
    assert isinstance(solved.result.extra["visits"], dict) and "visits" not in solved.row
    assert solved.row["rollouts"] == solved.result.extra["rollouts"]
    assert solved.tree(task.problems()[0])["expansions"] == solved.result.expansions


def test_a_shared_runtime_problem_without_a_root_exports_no_other_problems_tree(tiny):
    """Under concurrency a problem whose prompt never got into the store (an OOM at prefill) has no
    root; its tree record must be empty, not the runtime's first tree (another problem's)."""
    from arbor_cli.runners.search import Solved

    rt = Runtime(tiny, policy="full")
    other = rt.new_tree("another problem's prompt")
    rt.expand(other, n=2, sampling=SamplingParams(max_new_tokens=3, seed=0))
    controller = SimpleNamespace(expansions=[], root=None)
    problem = SimpleNamespace(index=7, question="q")
    shared = Solved({}, rt, controller, None, rt.metrics, rt.events, None, shared=True)
    assert shared.tree(problem)["nodes"] == []
    alone = Solved({}, rt, controller, None, rt.metrics, rt.events, None)  # a runtime of its own: its one tree
    assert [n["id"] for n in alone.tree(problem)["nodes"]] == [other.id, *(c.id for c in other.children)]
