"""Controllers end to end on the tiny model, reproducibility, and each search's defining behaviour.

The behaviour tests pair a scripted task (every thought valid, numbered in creation order) with a
scripted verifier (scores looked up by that number), so the random model's text cannot matter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import get_class, instantiate

from arbor_cli.build import build_task, build_verifier, compose_config
from arbor_runtime import Node, Runtime
from arbor_runtime.controllers import Controller, SearchResult
from arbor_runtime.tasks.base import Problem, StepResult, Task
from arbor_runtime.verifiers.base import Scale, Verifier

REPO = Path(__file__).resolve().parents[1]
#: tiny budgets per controller, so the whole file stays fast on two CPU cores
SMALL = {
    "bfs": {"n_generate": 2, "breadth": 2},
    "beam": {"beam_width": 2, "samples_per_node": 2},
    "dfs": {"n_generate": 2, "max_visits": 4},
    "best_first": {"n_generate": 2, "max_expansions": 4},
    "mcts": {"n_generate": 2, "iterations": 4},
}
#: task options shortened for the tiny model (applied when the task config has the key)
# propose: game24 only; sampled thoughts are what record_nodes sees (legal steps come from rt.choose)
SHORT_TASK = {"max_steps": 2, "max_thought_tokens": 8, "propose": "sample"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def task_options() -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / "task").glob("*.yaml"))


#: controller config name -> the class it builds
CONTROLLERS = {name: get_class(compose_config([f"controller={name}"]).controller._target_) for name in SMALL}


def build(controller: str, task_name: str, runtime: Runtime, data_dir: Path) -> tuple[Controller, Task]:
    """Controller ``controller`` from its config on one problem of ``task_name`` (the task's own verifier)."""
    overrides = [f"task={task_name}", f"controller={controller}", f"paths.data_dir={data_dir}"]
    cfg = compose_config(overrides)
    short = [f"task.{k}={v}" for k, v in SHORT_TASK.items() if k in cfg.task]
    cfg = compose_config([*overrides, f"task.end={cfg.task.start + 1}", *short])
    task = build_task(cfg)
    verifier = build_verifier(cfg, task)
    ctrl = instantiate(cfg.controller, runtime=runtime, task=task, verifier=verifier, **SMALL[controller])
    return ctrl, task


def record_nodes(rt: Runtime) -> list[tuple[int | None, tuple[int, ...]]]:
    """Wrap ``rt``'s node-creating calls; the returned list fills with (parent id, token ids)."""
    created: list[tuple[int | None, tuple[int, ...]]] = []
    expand_many, append = rt.expand_many, rt.append

    def expand_many_rec(requests, sampling=None):
        groups = expand_many(requests, sampling)
        created.extend((k.parent.id, tuple(k.token_ids)) for g in groups for k in g)
        return groups

    def append_rec(node, text):
        child = append(node, text)
        created.append((node.id, tuple(child.token_ids)))
        return child

    rt.expand_many, rt.append = expand_many_rec, append_rec
    return created


def test_every_controller_config_is_covered_and_named_after_its_config():
    assert set(SMALL) == {p.stem for p in (REPO / "conf" / "controller").glob("*.yaml")}
    assert all(cls.name == name and issubclass(cls, Controller) for name, cls in CONTROLLERS.items())


@pytest.mark.parametrize("task_name", task_options())
@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_controller_solves_one_problem_reproducibly(name, task_name, tiny, data_dir):
    runs = []
    for _ in range(2):
        rt = Runtime(tiny, seed=0)
        created = record_nodes(rt)
        ctrl, task = build(name, task_name, rt, data_dir)
        assert isinstance(ctrl, CONTROLLERS[name])
        result = ctrl.solve(task.problems()[0])
        assert isinstance(result, SearchResult) and result.steps >= 1
        assert result.expansions and result.expansions[0] == 0  # the root is expanded first
        assert created and rt.metrics.nodes_created == len(created) + 1
        runs.append((created, result.expansions, result.off_path_expansions, result.answer))
    assert runs[0] == runs[1]


# ---- scripted search problems ---------------------------------------------------------------
class NumberedTask(Task):
    """Every thought is valid; the state is the path of thought numbers (1, 2, ... in creation order).

    A path ends after ``max_steps`` thoughts, or at a thought whose number is in ``ends``.
    """

    name = "numbered"
    max_thought_tokens = 4

    def __init__(self, max_steps: int = 3, ends: frozenset[int] = frozenset()) -> None:
        self.max_steps, self.ends, self.count = max_steps, ends, 0

    def problems(self) -> list[Problem]:
        return [Problem(index=0, question="count")]

    def prompt(self, problem: Problem) -> str:
        return "Count with me: "

    def initial_state(self, problem: Problem) -> tuple[int, ...]:
        return ()

    def step(self, problem: Problem, state: tuple[int, ...], thought: str) -> StepResult:
        self.count += 1
        path = (*state, self.count)
        terminal = len(path) >= self.max_steps or self.count in self.ends
        return StepResult(state=path, terminal=terminal, answer="-".join(map(str, path)) if terminal else None)

    def is_correct(self, problem: Problem, answer: str | None) -> bool:
        return False


class ScriptedVerifier(Verifier):
    """Scores the newest thought number from a table; else ``terminal`` (when set) or ``default``.

    A finished path scoring 1.0 counts as checked correct (the search stops there).
    """

    scale = Scale(solution=1.0)

    def __init__(self, table: dict[int, float], default: float, terminal: float | None = None) -> None:
        self.table, self.default, self.terminal = table, default, terminal

    def score(self, problem: Problem, result: StepResult) -> float:
        fallback = self.terminal if result.terminal and self.terminal is not None else self.default
        return self.table.get(result.state[-1], fallback)


def scripted(name: str, tiny, verifier: Verifier, **kwargs) -> tuple[Controller, Runtime]:
    """Controller ``name`` on the numbered task; nothing is released, so every node stays in ``rt.nodes``."""
    rt = Runtime(tiny, seed=0)
    return CONTROLLERS[name](rt, NumberedTask(), verifier, release_pruned=False, **kwargs), rt


def parent_id(rt: Runtime, node_id: int) -> int:
    return rt.nodes[node_id].parent.id


def is_descendant(node: Node, ancestor: Node) -> bool:
    return any(n is ancestor for n in node.path())


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_controller_grows_and_releases_a_deep_tree_reproducibly(name, tiny):
    """Every thought valid, scores spread over [0, 1): deeper trees, pruning and releases on."""
    scores = {i: (i * 37 % 100) / 100 for i in range(1, 500)}
    runs = []
    for _ in range(2):
        rt = Runtime(tiny, seed=0)
        created = record_nodes(rt)
        ctrl = CONTROLLERS[name](rt, NumberedTask(), ScriptedVerifier(scores, 0.5), **SMALL[name])
        result = ctrl.solve(ctrl.task.problems()[0])
        assert len(result.expansions) > 1 and max(n.depth for n in rt.all_nodes.values()) >= 2
        released = {i for i, n in rt.all_nodes.items() if n.released}
        assert released == set(rt.all_nodes) - set(rt.nodes) and len(released) == rt.metrics.nodes_released
        assert all(not a.released for n in rt.nodes.values() for a in n.path())  # live nodes keep their path
        assert result.best is None or not result.best.released  # the answer is never pruned away
        if name != "mcts":  # 4 mcts iterations reach no finished path and no dead node: nothing to release
            assert released
        best = None if result.best is None else result.best.meta["state"]
        runs.append((created, result.expansions, best, sorted(released)))
    assert runs[0] == runs[1]


def expanded_states(rt: Runtime, result: SearchResult) -> list[tuple[int, ...]]:
    return [rt.all_nodes[i].meta["state"] for i in result.expansions]


def released_states(rt: Runtime) -> set[tuple[int, ...]]:
    """States of the released thoughts (forced blocks have none here: the numbered task writes no text)."""
    return {n.meta["state"] for n in rt.all_nodes.values() if n.released and "state" in n.meta}


def test_bfs_keeps_the_best_breadth_of_each_level_and_expands_them_in_one_batch(tiny):
    # level 1: root -> 1, 2, 3; keep 2 and 3 (the best two). level 2 (one batch): 2 -> 4, 5, 6 and
    # 3 -> 7, 8, 9; keep 7 and 8. level 3: every thought ends the path; 11 scores 1.0 and wins.
    # Released: every dropped thought, 2 once none of its children was kept, 8 once its children
    # lost to 11 (nothing below it can be used again).
    scores = {1: 0.2, 2: 0.9, 3: 0.5, 4: 0.1, 5: 0.3, 6: 0.2, 7: 0.8, 8: 0.7, 9: 0.05, 11: 1.0}
    rt = Runtime(tiny, seed=0)
    batches = []
    expand_many = rt.expand_many
    rt.expand_many = lambda requests, sampling=None: (
        batches.append([n.id for n, _ in requests]) or expand_many(requests, sampling)
    )
    ctrl = CONTROLLERS["bfs"](rt, NumberedTask(), ScriptedVerifier(scores, 0.4), n_generate=3, breadth=2)
    result = ctrl.solve(ctrl.task.problems()[0])
    assert expanded_states(rt, result) == [(), (2,), (3,), (3, 7), (3, 8)]
    assert [len(b) for b in batches] == [1, 2, 2] and result.steps == 3
    assert result.best.meta["state"] == (3, 7, 11) and result.best.value == 1.0
    assert released_states(rt) == {(1,), (2,), (2, 4), (2, 5), (2, 6), (3, 9), (3, 7, 10), (3, 7, 12), (3, 8)} | {
        (3, 8, i) for i in (13, 14, 15)
    }


def test_beam_moves_finished_paths_to_a_terminal_beam(tiny):
    # step 1: root -> 1 (0.9), 2 (0.8, ends its path): 2 goes to the terminal beam, the beam is [1].
    # step 2: 1 -> 3 (0.5), 4 (0.95): both open, both fit the beam (the finished 2 takes no slot).
    # step 3: 4 -> 5 (0.3), 6 (0.85) and 3 -> 7, 8 (0.0), all finished (max_steps): best 6.
    scores = {1: 0.9, 2: 0.8, 3: 0.5, 4: 0.95, 5: 0.3, 6: 0.85}
    rt = Runtime(tiny, seed=0)
    task = NumberedTask(max_steps=3, ends=frozenset({2}))
    ctrl = CONTROLLERS["beam"](rt, task, ScriptedVerifier(scores, 0.0), beam_width=2, samples_per_node=2)
    result = ctrl.solve(task.problems()[0])
    assert expanded_states(rt, result) == [(), (1,), (1, 4), (1, 3)] and result.steps == 3
    assert result.best.meta["state"] == (1, 4, 6)  # the best finished path, above the early one (0.8)
    assert [c.node.meta["state"] for c in ctrl.finished] == [(1, 4, 6), (2,)]  # the terminal beam
    assert result.extra["finished"] == 2 and result.extra["vote_count"] == 1
    assert released_states(rt) == {(2,), (1, 3), (1, 3, 7), (1, 3, 8), (1, 4, 5)}  # all but the best path


def test_beam_returns_the_best_unfinished_path_at_max_depth(tiny):
    scores = {1: 0.2, 2: 0.6, 3: 0.9, 4: 0.1, 5: 0.4, 6: 0.3}
    rt = Runtime(tiny, seed=0)
    task = NumberedTask(max_steps=3)
    ctrl = CONTROLLERS["beam"](rt, task, ScriptedVerifier(scores, 0.0), beam_width=2, samples_per_node=2, max_depth=2)
    result = ctrl.solve(task.problems()[0])
    assert result.steps == 2 and result.extra["finished"] == 0
    assert result.best is not None and not result.best.released
    assert result.best.meta["state"] == (2, 3) and result.answer is None and not result.solved


def test_dfs_backtracks_from_a_dead_end(tiny):
    # root -> 1 (0.9), 2 (0.8); 1 -> 3, 4 both below the threshold: a dead end, back to the root's 2;
    # 2 -> 5 (0.75), 6 (0.7); 5 -> 7, 8 terminal at 1.0: a solution.
    verifier = ScriptedVerifier({1: 0.9, 2: 0.8, 3: 0.1, 4: 0.2, 5: 0.75}, 0.7, terminal=1.0)
    ctrl, rt = scripted("dfs", tiny, verifier, n_generate=2, value_threshold=0.5)
    result = ctrl.solve(ctrl.task.problems()[0])
    assert result.extra["backtracks"] == 1 and result.extra["visits"] == 4
    root, first, second, third = result.expansions
    assert parent_id(rt, first) == root and parent_id(rt, second) == root  # back to the root's other child
    assert parent_id(rt, third) == second
    assert result.best.meta["state"] in {(2, 5, 7), (2, 5, 8)} and result.best.value == 1.0
    assert result.answer.startswith("2-5-") and not result.solved  # NumberedTask accepts no answer


def test_dfs_stops_at_max_visits(tiny):
    ctrl, _ = scripted("dfs", tiny, ScriptedVerifier({}, 0.1), n_generate=2, value_threshold=0.0, max_visits=3)
    result = ctrl.solve(ctrl.task.problems()[0])
    assert result.extra["visits"] == 3 and len(result.expansions) == 3
    assert result.best.value == 0.1  # a terminal, but no solution


def test_best_first_jumps_between_branches(tiny):
    # root -> 1 (0.9), 2 (0.8); 1 -> 3, 4 (0.1): the queue's best is now 2, on another branch.
    verifier = ScriptedVerifier({1: 0.9, 2: 0.8, 3: 0.1, 4: 0.1, 5: 0.6}, 0.5)
    ctrl, rt = scripted("best_first", tiny, verifier, n_generate=2, max_expansions=4)
    result = ctrl.solve(ctrl.task.problems()[0])
    nodes = [rt.nodes[i] for i in result.expansions]
    assert [n.meta.get("state") for n in nodes] == [(), (1,), (2,), (2, 5)]
    assert result.off_path_expansions > 0
    assert any(not is_descendant(b, a) for a, b in zip(nodes[:-1], nodes[1:], strict=True))


def test_best_first_keeps_frontier_and_releases_exhausted(tiny):
    # children of 1 are all terminal and wrong (0.0): 1 is popped and exhausted, so it is released;
    # 2, still on the frontier, stays resident until it is expanded.
    rt = Runtime(tiny, seed=0)
    verifier = ScriptedVerifier({1: 0.9, 2: 0.8, 3: 0.0, 4: 0.0}, 0.5)
    ctrl = CONTROLLERS["best_first"](rt, NumberedTask(max_steps=2), verifier, n_generate=2, max_expansions=3)
    result = ctrl.solve(ctrl.task.problems()[0])
    root, one, two = (rt.nodes.get(i) for i in (0, 1, 2))
    assert result.expansions == [0, 1, 2]
    assert one is None  # released with its (terminal, not best) children
    assert two is not None and not two.released and root is not None


@pytest.mark.parametrize("rollout", [False, True])
def test_mcts_visit_counts_add_up(rollout, tiny):
    scores = {i: (i * 37 % 10) / 10 for i in range(1, 200)}  # all below 1.0: no early stop
    ctrl, _ = scripted("mcts", tiny, ScriptedVerifier(scores, 0.5), n_generate=2, iterations=7, rollout=rollout)
    result = ctrl.solve(ctrl.task.problems()[0])
    visits, ends, tree = result.extra["visits"], result.extra["ends"], result.extra["tree"]
    assert result.steps == 7 and visits[0] == 7 and sum(ends.values()) == 7
    for node_id, kids in tree.items():
        assert visits.get(node_id, 0) == ends.get(node_id, 0) + sum(visits.get(k, 0) for k in kids)
    assert (result.extra["rollouts"] > 0) == rollout
    assert result.best is not None and result.best.meta["terminal"]  # depth 3 reached within 7 iterations


def test_mcts_stops_at_a_solution(tiny):
    ctrl, _ = scripted("mcts", tiny, ScriptedVerifier({}, 0.5, terminal=1.0), n_generate=2, iterations=20)
    result = ctrl.solve(ctrl.task.problems()[0])
    assert result.best.value == 1.0 and len(result.best.meta["state"]) == 3
    # every node is valued on its first visit and expanded on its second: root (1), its second
    # child (2), each depth-1 node expanded (3, 4), their second children (5, 6), then a depth-2
    # node expands into finished paths scoring 1.0 (7)
    assert result.steps == 7 and result.extra["visits"][0] == 7


def test_custom_search_example_runs(data_dir, tmp_path):
    cmd = [
        sys.executable, str(REPO / "scripts" / "custom_search.py"), "model=tiny-random",
        f"paths.data_dir={data_dir}", "task.start=900", "task.end=901", f"run_dir={tmp_path}",
        f"hydra.run.dir={tmp_path / 'hydra'}", "controller.n_generate=2",
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [900] and rows[0]["nodes_created"] >= 3


def test_readme_shows_the_custom_controller_that_runs():
    """The custom-search example of docs/python-api.md (moved there from the README) is the class
    scripts/custom_search.py runs."""
    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "docs" / "python-api.md").read_text()
    block = readme.split("### Writing your own search", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert block.startswith("class GreedyLookahead(Controller):")
    assert block in (repo / "scripts" / "custom_search.py").read_text()
    assert len([line for line in block.splitlines() if line.strip()]) < 50


def test_controller_runs_become_the_controllers_section(tiny, data_dir, tmp_path):
    """bench_controllers.sh's run dirs (one per task and controller: arbor-solve's results.jsonl) ->
    docs/data/controllers (benchmarks.results.collect) -> the section: a row per problem, named by its
    run dir, with what the run recorded; no stale line."""
    from arbor_cli.run import run
    from benchmarks.results.collect import write as collect
    from benchmarks.results.data import load_section
    from benchmarks.results.sections import Section, render_section

    for name in ("dfs", "bfs"):
        run_dir = tmp_path / "ctrl" / f"game24-{name}"
        overrides = ["model=tiny-random", f"paths.data_dir={data_dir}", f"experiment=ctrl/{name}", "task=game24",
                     "verifier=game24_oracle", "task.start=900", "task.end=901", f"run_dir={run_dir}"]  # fmt: skip
        assert run(compose_config(overrides)) == 0
    collect("controllers", tmp_path / "ctrl", "bash scripts/bench_controllers.sh", data_root=tmp_path / "data")
    section = load_section("controllers", tmp_path / "data")
    rows = section["tables"]["main"]["rows"]
    recorded = json.loads((tmp_path / "ctrl" / "game24-bfs" / "results.jsonl").read_text().splitlines()[0])
    assert [(r["task_controller"], r["problem"]) for r in rows] == [("game24-bfs", 900), ("game24-dfs", 900)]
    assert rows[0]["peak_kv_tok"] == recorded["peak_device_tokens"] and rows[0]["steps"] == recorded["steps"]
    assert rows[0]["verifier"] == "game24_oracle" and rows[0]["solved"] in ("yes", "no")
    text = render_section(Section("controllers"), section)
    assert "Not current" not in text and "| game24-dfs | 900 |" in text
