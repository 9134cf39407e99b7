"""Several searches in one runtime: shared batch steps, one budget, results independent of concurrency."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from arbor_runtime import KVBudgetExceeded, Node, Runtime, SamplingParams
from arbor_runtime.controllers.best_first import BestFirstController
from arbor_runtime.controllers.bfs import BFSController
from arbor_runtime.controllers.mcts import MCTSController
from arbor_runtime.tasks.base import Problem, StepResult, Task, ValuePrompt, ValueQuery
from arbor_runtime.verifiers.base import Verifier

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPTS = [f"Problem {i}: count the steps.\nSteps:\n" for i in range(4)]


class EchoValue(ValuePrompt):
    """A value prompt for the echo task: the model's verdict on the path so far."""

    prefix = "Judge each path: sure, likely or impossible.\n"

    def query(self, problem: Problem, state) -> ValueQuery:
        return ValueQuery(("echo", problem.question, state), f"Path: {'|'.join(state)}\nVerdict:")


class EchoTask(Task):
    """Every thought is a valid step; the state is the path of thought texts (content, not order)."""

    name = "echo"
    max_thought_tokens = 5
    stop = ()
    verifiers = ("content", "llm_value")
    value_prompt = EchoValue()

    def __init__(self, max_steps: int = 3) -> None:
        self.max_steps = max_steps

    def problems(self) -> list[Problem]:
        return [Problem(index=i, question=p) for i, p in enumerate(PROMPTS)]

    def prompt(self, problem: Problem) -> str:
        return problem.question

    def initial_state(self, problem: Problem) -> tuple[str, ...]:
        return ()

    def step(self, problem: Problem, state: tuple[str, ...], thought: str) -> StepResult:
        path = (*state, thought)
        return StepResult(state=path, terminal=len(path) >= self.max_steps, forced_text=" ;")

    def final_answer(self, problem: Problem, state) -> str | None:
        return "|".join(state)

    def is_correct(self, problem: Problem, state) -> bool:
        return False


class ContentVerifier(Verifier):
    """A score that is a function of the thought's text only."""

    name = "content"

    def score(self, problem: Problem, result: StepResult) -> float:
        return (sum(map(ord, result.state[-1])) % 97) / 97


def llm_value():
    from arbor_runtime.verifiers.llm_value import LLMValueVerifier

    return LLMValueVerifier(n_evaluate=2, max_new_tokens=3)


CONTROLLERS = {
    "bfs+llm_value": lambda rt, task: BFSController(rt, task, llm_value(), n_generate=2, breadth=2),
    "bfs": lambda rt, task: BFSController(rt, task, ContentVerifier(), n_generate=2, breadth=2, release_pruned=False),
    "best_first": lambda rt, task: BestFirstController(rt, task, ContentVerifier(), n_generate=2, max_expansions=4),
    "mcts": lambda rt, task: MCTSController(rt, task, ContentVerifier(), n_generate=2, iterations=3),
}


def signature(rt: Runtime, root: Node) -> list[tuple]:
    """A tree by content, released nodes included: (parent's position, depth, tokens, value,
    released) per node in creation order (node ids differ between runs; their order within a
    tree does not)."""
    nodes = sorted((n for n in rt.all_nodes.values() if n.tree_id == root.id), key=lambda n: n.id)
    pos = {n.id: i for i, n in enumerate(nodes)}
    return [
        (None if n.parent is None else pos[n.parent.id], n.depth, tuple(n.token_ids), n.value, n.released)
        for n in nodes
    ]


def solve_all(rt: Runtime, name: str, concurrency: int) -> dict[int, tuple]:
    """Solve every problem with ``name``; ``concurrency`` threads share ``rt``."""
    task = EchoTask()

    def one(problem):
        with rt.account() as acc:
            result = CONTROLLERS[name](rt, task).solve(problem, seed=100 + problem.index)
        root = next(n for n in rt.all_nodes.values() if n.parent is None and n.text == problem.question)
        return problem.index, (signature(rt, root), result.answer, result.expansions and len(result.expansions), acc)

    with ThreadPoolExecutor(concurrency) as pool:
        return dict(pool.map(one, task.problems()))


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_results_per_problem_are_identical_at_concurrency_1_and_4(tiny, name):
    alone = solve_all(Runtime(tiny), name, 1)
    rt = Runtime(tiny)
    together = solve_all(rt, name, 4)
    assert {i: r[:3] for i, r in alone.items()} == {i: r[:3] for i, r in together.items()}
    for sig, _, _, acc in together.values():  # each search's own counts (with llm_value, its value queries too)
        generated = sum(len(t) for _, depth, t, *_ in sig if depth % 2 == 1)
        forced = sum(len(t) for _, depth, t, *_ in sig if depth % 2 == 0)
        if "llm_value" in name:  # query + verdict scored as choices: nothing sampled or stored, only scored
            assert acc.metrics.decode_tokens == generated and acc.metrics.prefill_tokens > forced
            assert acc.metrics.scored_tokens > 0
        else:
            assert acc.metrics.decode_tokens == generated and acc.metrics.prefill_tokens == forced
    for field in ("decode_tokens", "prefill_tokens", "nodes_created"):  # every count belongs to one search
        assert getattr(rt.metrics, field) == sum(getattr(r[3].metrics, field) for r in together.values())


def test_concurrent_searches_share_batch_steps(tiny):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=1, stop_at_eos=False)
    barrier = threading.Barrier(4)
    rt = Runtime(tiny)

    def one(i):
        root = rt.new_tree(PROMPTS[i], seed=i)
        barrier.wait()
        return [k.token_ids for k in rt.expand(root, 3, params)]

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(one, range(4)))
    steps_together = rt.backend.forward_calls - 4  # the four prompts' prefills
    ref = Runtime(tiny)
    alone = [[k.token_ids for k in ref.expand(ref.new_tree(p, seed=i), 3, params)] for i, p in enumerate(PROMPTS)]
    assert together == alone
    assert steps_together < 4 * 6  # four expansions of 6 steps each ran in shared steps


def test_budget_holds_across_trees_and_arbor_waits_instead_of_failing(tiny):
    probe = Runtime(tiny)
    prompt_len = probe.new_tree(PROMPTS[0]).length
    budget = 2 * prompt_len + 24  # not enough for four searches at once
    rt = Runtime(tiny, policy="arbor", budget_tokens=budget)
    out = solve_all(rt, "bfs", 4)
    alone = solve_all(Runtime(tiny), "bfs", 1)
    assert {i: r[:3] for i, r in out.items()} == {i: r[:3] for i, r in alone.items()}
    assert rt.store.pool.peak_used <= budget and rt.metrics.peak_device_tokens <= budget
    assert rt.metrics.rehydrations > 0  # trees took turns, their blocks went to the host and came back


def test_one_failing_search_does_not_stop_the_others(tiny):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3, stop_at_eos=False)
    too_long = SamplingParams(max_new_tokens=400, temperature=1.0, seed=3, stop_at_eos=False)  # > the budget alone
    rt = Runtime(tiny, policy="full", budget_tokens=200)

    def one(i):
        root = rt.new_tree(PROMPTS[i], seed=i)
        try:
            kids = rt.expand(root, 2, too_long if i == 0 else params)
            return [k.length for k in rt.expand(kids[0], 2, params)]
        except KVBudgetExceeded as exc:
            return str(exc)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, range(3)))
    assert "budget_tokens=200" in results[0]
    assert results[1] == results[2] == [8, 8]


def test_releasing_one_tree_leaves_the_others_kv_untouched(tiny):
    rt = Runtime(tiny, policy="arbor", budget_tokens=400)
    roots = [rt.new_tree(p, seed=i) for i, p in enumerate(PROMPTS[:2])]
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=0)
    for root in roots:
        rt.expand(rt.expand(root, 2, params)[0], 2, params)
    mine = [n for n in roots[0].subtree()]
    before = {n.id: rt.store.read(n.id) for n in mine}
    theirs = [n.id for n in roots[1].subtree()]
    rt.release(roots[1])
    assert all(i not in rt.store for i in theirs)
    assert rt.store.pool.used == rt.store.resident_tokens == sum(n.length for n in mine)
    for n in mine:
        now = rt.store.read(n.id)
        assert torch.equal(now[0], before[n.id][0]) and torch.equal(now[1], before[n.id][1])
    rt.expand(roots[0], 1, params)  # the surviving tree goes on


# ---- arbor-solve concurrency=N ----------------------------------------------------------------
def run_cli(data_dir, run_dir, *extra):
    from rich.console import Console

    from arbor_cli.build import compose_config
    from arbor_cli.results import RESULTS_FILE, read_jsonl
    from arbor_cli.run import run

    overrides = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={run_dir}", "task.start=900"]
    overrides += ["task.end=904", "controller.n_generate=2", "controller.breadth=2", "verifier=llm_value", *extra]
    assert run(compose_config(overrides), console=Console(width=200)) == 0
    return {r["index"]: r for r in read_jsonl(run_dir / RESULTS_FILE)}


def test_cli_concurrency_gives_every_problem_the_same_result(data_dir, tmp_path):
    keys = ("solved", "answer", "best_path", "decode_tokens", "oom", "error")
    # the prefill accounting below is of one value-prefix tree per runtime; sharing of prompt prefixes
    # across trees (on by default) is checked at the end
    one = run_cli(data_dir, tmp_path / "c1", "share_prefixes=false")
    four = run_cli(data_dir, tmp_path / "c4", "concurrency=4", "share_prefixes=false")
    assert sorted(one) == sorted(four) == [900, 901, 902, 903]
    assert {i: {k: r[k] for k in keys} for i, r in one.items()} == {i: {k: r[k] for k in keys} for i, r in four.items()}
    # llm_value's few-shot value prefix is a tree of its own, prefilled once per runtime: four fresh
    # runtimes build it four times, one shared runtime once (in whichever search asks first)
    assert sum(r["verifier_calls"] for r in one.values()) > 0
    extra_nodes = {i: one[i]["nodes_created"] - four[i]["nodes_created"] for i in one}
    extra_prefill = {i: one[i]["prefill_tokens"] - four[i]["prefill_tokens"] for i in one}
    assert sorted(extra_nodes.values()) == [0, 1, 1, 1]
    prefix_tokens = max(extra_prefill.values())
    assert prefix_tokens > 0 and sorted(extra_prefill.values()) == [0] + [prefix_tokens] * 3
    assert [i for i in one if extra_nodes[i] == 0] == [i for i in one if extra_prefill[i] == 0]
    again = run_cli(data_dir, tmp_path / "c4", "concurrency=2")  # resume: nothing left to do, nothing written twice
    assert again.keys() == four.keys()
    # the task's few-shot prompt stored once for the four searches: the same results, fewer prefill tokens
    shared = run_cli(data_dir, tmp_path / "c4-shared", "concurrency=4")
    assert sorted(shared) == sorted(one)
    assert all({k: shared[i][k] for k in keys} == {k: one[i][k] for k in keys} for i in one)
    saved = sum(r["prefix_prefill_saved_tokens"] for r in shared.values())
    assert saved > 0 and sum(r["prefix_trees"] for r in shared.values()) >= 3
    assert sum(r["prefill_tokens"] for r in shared.values()) == sum(r["prefill_tokens"] for r in four.values()) - saved


def test_cli_concurrency_needs_one_absolute_budget(data_dir, tmp_path, capsys):
    from arbor_cli.build import compose_config
    from arbor_cli.run import run

    over = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={tmp_path}", "concurrency=0"]
    assert run(compose_config(over)) == 2
    assert "concurrency=0 must be a positive integer" in capsys.readouterr().err


def test_an_engine_error_reaches_every_waiting_search(tiny, monkeypatch):
    rt = Runtime(tiny)
    roots = [rt.new_tree(p, seed=i) for i, p in enumerate(PROMPTS[:3])]
    params = SamplingParams(max_new_tokens=30, temperature=1.0, seed=0, stop_at_eos=False)
    calls = {"n": 0}
    forward = rt.backend.forward

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 12:
            raise RuntimeError("device lost")
        return forward(*args, **kwargs)

    monkeypatch.setattr(rt.backend, "forward", failing)

    def one(root):
        try:
            rt.expand(root, 2, params)
            return "ok"
        except RuntimeError as exc:
            return str(exc)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, roots))
    assert "device lost" in results  # nobody hangs; the searches whose step failed hear why
    assert rt.store.pool.used == rt.store.resident_tokens  # no slots left in flight
    monkeypatch.setattr(rt.backend, "forward", forward)
    assert len(rt.expand(roots[0], 1, params)) == 1  # the runtime goes on


def test_bench_concurrency_runs_every_level_and_naive_tot_on_the_same_problems(data_dir, tmp_path, capsys):
    from benchmarks.concurrency import concurrency_main

    over = ["model=tiny-random", f"paths.data_dir={data_dir}", "task.start=900", "task.end=902"]
    over += ["controller.n_generate=2", "controller.breadth=2", "verifier=llm_value"]
    over += ["task.propose=sample"]  # naive ToT samples its proposals (with legal ones it decodes nothing)
    assert concurrency_main(["--levels", "1,2", "--naive", "--out", str(tmp_path), *over]) == 0
    rows = [json.loads(line) for line in (tmp_path / "concurrency.jsonl").read_text().splitlines()]
    assert [(r["policy"], r["concurrency"]) for r in rows] == [("policy=full", 1), ("policy=full", 2), ("naive ToT", 1)]
    assert all(r["problems"] == 2 and r["problems_per_hour"] > 0 for r in rows)
    assert rows[1]["same_results_as_concurrency_1"] is True
    assert rows[0]["peak_device_tokens_sum"] >= rows[0]["peak_device_tokens"] > 0  # 2 problems, each its own peak
    assert rows[0]["prefix_prefill_saved_tokens"] == 0 < rows[1]["prefix_prefill_saved_tokens"]  # shared at 2 only
    assert rows[2]["decode_tokens"] > 0 and not (tmp_path / "concurrency.partial.jsonl").exists()
    assert concurrency_main(["--levels", "0", "--out", str(tmp_path), *over]) == 2
    assert "--levels '0'" in capsys.readouterr().err

    # interrupted after its first setting: the same command keeps that row and measures the rest; a
    # torn last line is dropped; other arguments start over
    args = {"levels": [1, 2], "policies": ["policy=full"], "naive": True, "overrides": over}
    (tmp_path / "concurrency.partial.args.json").write_text(json.dumps(args))
    kept = rows[0] | {"seconds": 12345.0}
    (tmp_path / "concurrency.partial.jsonl").write_text(json.dumps(kept) + "\n" + '{"policy": "pol')
    assert concurrency_main(["--levels", "1,2", "--naive", "--out", str(tmp_path), *over]) == 0
    assert "resuming: 1 setting(s) measured before are kept" in capsys.readouterr().out
    again = [json.loads(line) for line in (tmp_path / "concurrency.jsonl").read_text().splitlines()]
    assert again[0] == kept and again[1]["seconds"] != 12345.0 and len(again) == 3
    assert again[1]["same_results_as_concurrency_1"] is True  # compared with the kept row's digest
    (tmp_path / "concurrency.partial.args.json").write_text(json.dumps(args | {"levels": [1]}))
    (tmp_path / "concurrency.partial.jsonl").write_text(json.dumps(kept) + "\n")
    assert concurrency_main(["--levels", "1,2", "--naive", "--out", str(tmp_path), *over]) == 0
    fresh = [json.loads(line) for line in (tmp_path / "concurrency.jsonl").read_text().splitlines()]
    assert fresh[0]["seconds"] != 12345.0 and fresh[0]["results_digest"] == kept["results_digest"]
