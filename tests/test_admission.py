"""Search-level admission: searches take turns when the budget cannot hold them all (engine/turns.py),
and the run's metrics say where waiting went."""

from __future__ import annotations

import sys

import pytest
from test_concurrency import CONTROLLERS, PROMPTS, EchoTask, solve_all

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.engine.turns import Turns
from arbor_runtime.planner import fits_together
from arbor_runtime.tree import demand_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BREAKDOWN = (
    "wait_seconds", "turn_wait_seconds", "preempted_tokens", "restore_seconds", "evict_seconds",
    "plan_seconds", "recompute_seconds", "decode_steps", "decode_step_rows", "rows_per_step",
)  # fmt: skip


def one_search_peak(tiny, name: str) -> int:
    """Device KV one search needs alone under ``full`` (its whole tree, nothing evicted)."""
    rt = Runtime(tiny)
    task = EchoTask()
    CONTROLLERS[name](rt, task).solve(task.problems()[0], seed=100)
    return rt.metrics.peak_device_tokens


def same_outputs(a: dict[int, tuple], b: dict[int, tuple]) -> bool:
    """Per problem: the same tree (parents, depths, tokens, released), answer and expansions; values
    within float noise (llm_value's scores are log-probabilities of batched forwards: 1e-6 apart)."""
    if a.keys() != b.keys():
        return False
    for i in a:
        (sig_a, *rest_a), (sig_b, *rest_b) = a[i][:3], b[i][:3]
        if rest_a != rest_b or len(sig_a) != len(sig_b):
            return False
        for (pa, da, ta, va, ra), (pb, db, tb, vb, rb) in zip(sig_a, sig_b, strict=True):
            if (pa, da, ta, ra) != (pb, db, tb, rb) or (va is None) != (vb is None):
                return False
            if va is not None and abs(va - vb) > 1e-4:
                return False
    return True


@pytest.mark.parametrize("name", ["bfs", "best_first", "bfs+llm_value"])
def test_four_searches_under_a_budget_for_one_give_what_one_at_a_time_gives(tiny, name):
    budget = one_search_peak(tiny, name)  # one search whole; four searches' active paths do not fit
    alone_rt = Runtime(tiny, policy="arbor", budget_tokens=budget)
    alone = solve_all(alone_rt, name, 1)
    rt = Runtime(tiny, policy="arbor", budget_tokens=budget)
    together = solve_all(rt, name, 4)
    assert same_outputs(together, alone)
    assert rt.store.pool.peak_used <= budget and rt.metrics.peak_device_tokens <= budget
    accounts = [r[3].metrics for r in together.values()]
    assert sum(m.turn_wait_seconds > 0 for m in accounts) >= 2  # searches waited for their turn
    assert rt.metrics.turn_wait_seconds == pytest.approx(sum(m.turn_wait_seconds for m in accounts))
    assert alone_rt.metrics.turn_wait_seconds == 0
    # taking turns keeps each search's path resident: interleaved rows rehydrated ~9x one at a time
    # before (212 vs 24 for bfs); with turns it stays within a small multiple
    assert rt.metrics.rehydrations <= 5 * max(alone_rt.metrics.rehydrations, 10)


def test_a_lone_search_in_an_account_is_never_held_back(tiny):
    budget = one_search_peak(tiny, "bfs") // 2  # tight: it evicts and waits for room, but never for a turn
    plain = Runtime(tiny, policy="arbor", budget_tokens=budget)
    task = EchoTask()
    ref = CONTROLLERS["bfs"](plain, task).solve(task.problems()[0], seed=100)
    rt = Runtime(tiny, policy="arbor", budget_tokens=budget)
    with rt.account() as acc:
        got = CONTROLLERS["bfs"](rt, task).solve(task.problems()[0], seed=100)
    assert got.answer == ref.answer
    assert [n.token_ids for n in got.best.path()] == [n.token_ids for n in ref.best.path()]
    assert acc.metrics.turn_wait_seconds == 0 and rt.metrics.forward_calls == plain.metrics.forward_calls
    assert acc.metrics.evicted_tokens > 0  # the budget did bind


def test_searches_that_fit_together_still_batch_together(tiny):
    alone_rt = Runtime(tiny)
    alone = solve_all(alone_rt, "bfs", 1)
    rt = Runtime(tiny, policy="arbor", budget_tokens=10_000)  # holds every search whole
    together = solve_all(rt, "bfs", 4)
    assert {i: r[:3] for i, r in together.items()} == {i: r[:3] for i, r in alone.items()}
    assert rt.metrics.turn_wait_seconds == 0
    assert rt.metrics.forward_calls < alone_rt.metrics.forward_calls  # shared steps
    assert rt.metrics.rows_per_step > alone_rt.metrics.rows_per_step


def test_the_breakdown_counts_preempted_tokens_waits_and_batch_sizes(tiny):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=20, seed=11, stop_at_eos=False)
    free = Runtime(tiny)
    root = free.new_tree(PROMPTS[0])
    free.expand(root, 6, params)
    tight = Runtime(tiny, policy="arbor", budget_tokens=root.length + 16)  # a growing row needs a preemption
    tight.expand(tight.new_tree(PROMPTS[0]), 6, params)
    m, f = tight.metrics, free.metrics
    assert m.preemptions > 0 and m.preempted_tokens >= m.preemptions  # each restart threw decoded tokens away
    assert f.preemptions == f.preempted_tokens == 0
    assert m.wait_seconds > f.wait_seconds  # rows waited whole decode steps for room; unbudgeted, none did
    # 12 tokens a row, each fed one step at a time (the last for the child's next logits)
    assert f.decode_steps == 12 and f.decode_step_rows == 6 * 12 and f.rows_per_step == 6
    assert m.decode_step_rows == f.decode_step_rows + m.preempted_tokens  # re-fed after each restart
    assert 1 <= m.rows_per_step < f.rows_per_step  # smaller batches under the budget
    assert m.evicted_tokens > 0 and m.evict_seconds > 0 and m.plan_seconds > 0
    out = m.to_dict()
    assert all(k in out for k in BREAKDOWN) and out["rows_per_step"] == round(m.rows_per_step, 3)


def within(budget):
    """The planner's answer for ``budget`` device slots: do these demands fit at once?"""
    return lambda entries: fits_together(entries, budget)


def test_turns_admit_searches_in_arrival_order_while_their_demands_fit(tiny):
    rt = Runtime(tiny)
    roots = [rt.new_tree(p, seed=i) for i, p in enumerate(PROMPTS[:3])]
    a, b, c = (type("Acc", (), {"closed": False})() for _ in range(3))
    turns = Turns(idle_seconds=1.0)
    one = demand_tokens([(roots[0], 8)])
    demand = {id(x): (x, [(r, 8)]) for x, r in zip((a, b, c), roots, strict=True)}
    turns.update(demand, fits=within(2 * one), now=0.0)
    assert turns.contended and turns.admits(a) and turns.admits(b) and not turns.admits(c)
    assert turns.admits(None)  # work outside accounts is never held back
    turns.update({id(c): demand[id(c)]}, fits=within(one), now=0.0)  # a and b between operations: still counted
    assert turns.admits(a) and not turns.admits(b) and not turns.admits(c)
    turns.update({id(c): demand[id(c)]}, fits=within(one), now=2.0)  # a idle past idle_seconds: goes to the back
    assert turns.admits(b) and not turns.admits(a)
    b.closed = True
    turns.update({id(c): demand[id(c)]}, fits=within(one), now=2.1)
    assert turns.admits(c) and turns.order == [c, a]
    turns.update(demand, fits=within(None), now=3.0)
    assert not turns.contended and all(turns.admits(x) for x in (a, b, c))


def test_a_shared_prompt_prefix_counts_once_in_what_searches_need_together(tiny):
    """Searches whose prompts share a stored prefix need it once: at a budget that holds the union of
    their paths (but not every prompt whole) every search is admitted (no turns are taken)."""
    few_shot = " ".join(f"step {i} of the worked example;" for i in range(40)) + "\n"
    rt = Runtime(tiny)
    roots = [rt.new_tree(few_shot + f"Input: {i} {i + 1} {i + 2} {i + 3}\n", seed=i) for i in range(4)]
    assert roots[1].kv is not None  # the later prompts attached below the first one's prefix
    accounts = [type("Acc", (), {"closed": False})() for _ in roots]
    demand = {id(a): (a, [(r, 8)]) for a, r in zip(accounts, roots, strict=True)}
    union = demand_tokens([(r, 8) for r in roots])
    whole = sum(r.length + 8 for r in roots)
    assert union < whole - 2 * len(rt.tokenizer(few_shot)["input_ids"]) // 2
    turns = Turns(idle_seconds=1.0)
    turns.update(demand, fits=within(union), now=0.0)
    assert not turns.contended and all(turns.admits(a) for a in accounts)
    turns.update(demand, fits=within(union - 1), now=0.0)
    assert turns.contended and not turns.admits(accounts[-1])


def test_cli_concurrency_4_under_a_budget_for_one_search_gives_the_results_of_concurrency_1(
    data_dir, tmp_path, monkeypatch, capfd
):
    from arbor_cli import solve
    from arbor_cli.results import RESULTS_FILE, read_jsonl

    monkeypatch.chdir(tmp_path)  # run from outside the checkout; every output under tmp_path
    rows = {}
    for level in (1, 4):
        argv = ["model=tiny-random", f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / f'c{level}'}"]
        argv += ["task.start=900", "task.end=904", "controller.n_generate=2", "controller.breadth=2"]
        argv += ["policy=arbor", "policy.budget_tokens=1000", f"concurrency={level}"]  # a search peaks at ~850
        monkeypatch.setattr(sys, "argv", ["arbor-solve", *argv])
        try:
            solve.main()
        except SystemExit as stop:
            assert stop.code in (0, None), capfd.readouterr().err[-3000:]
        rows[level] = {r["index"]: r for r in read_jsonl(tmp_path / f"c{level}" / RESULTS_FILE)}
    keys = ("solved", "answer", "best_path", "oom", "error", "nodes_expanded")
    assert sorted(rows[1]) == sorted(rows[4]) == [900, 901, 902, 903]
    assert {i: {k: r[k] for k in keys} for i, r in rows[1].items()} == {
        i: {k: r[k] for k in keys} for i, r in rows[4].items()
    }
    assert all(k in r for r in rows[4].values() for k in BREAKDOWN)
    assert sum(r["turn_wait_seconds"] > 0 for r in rows[4].values()) >= 2
    assert all(r["turn_wait_seconds"] == 0 for r in rows[1].values())
    assert all(r["peak_device_tokens"] <= 1000 for r in rows[4].values())


def test_a_first_search_blocked_on_a_lock_the_next_search_holds_does_not_deadlock(tiny):
    """The shape of a shared LLM value verifier at concurrency 2 (CI hung on it): search A is first
    in line and holds a turn, then blocks on a lock that search B holds while B prefills a new root
    (a value prompt). B's prefill must count as B's work waiting for a turn, so A, idle, goes to the
    back and B is admitted (with sharing on, a new root's work once reported no demand: B waited
    forever for a turn no rule gave it)."""
    import threading

    prompts = [f"prompt {c}: " + " ".join(f"{c}{i}" for i in range(60)) for c in "abc"]
    lengths = [len(tiny.tokenizer(p)["input_ids"]) for p in prompts]
    rt = Runtime(tiny, policy="arbor", budget_tokens=max(lengths) + lengths[0] // 2)
    lock, a_first, b_expanded, a_again = threading.Lock(), threading.Event(), threading.Event(), threading.Event()
    done, errors = [], []
    sampling = SamplingParams(max_new_tokens=4, seed=0)

    def wait(event: threading.Event) -> None:
        if not event.wait(30):  # each step takes seconds; a missing turn waits forever
            raise TimeoutError("a search waited 30 s for another's turn")

    def search_a():
        with rt.account():
            rt.expand(rt.new_tree(prompts[0], seed=0), n=1, sampling=sampling)
            a_first.set()
            wait(b_expanded)
            rt.expand(rt.new_tree(prompts[0] + " again", seed=1), n=1, sampling=sampling)  # A first again
            a_again.set()
            with lock:  # held by B across its prefill below
                done.append("a")

    def search_b():
        wait(a_first)
        with rt.account():
            rt.expand(rt.new_tree(prompts[1], seed=2), n=1, sampling=sampling)
            with lock:
                b_expanded.set()
                wait(a_again)
                rt.new_tree(prompts[2], seed=3)  # A waits on the lock: B must get the turn
                done.append("b")

    def guarded(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(f,), daemon=True) for f in (search_a, search_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(done) == ["a", "b"], "a search waited forever for its turn"
    assert rt.metrics.turn_wait_seconds > 0  # the searches did contend (the case this test is about)
