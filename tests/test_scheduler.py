"""The scheduler, the executor and the memory planner on plain bookkeeping: a real KVStore of a tiny KV
shape, real policies, rows and nodes made by hand, no model (a row's first token is sampled from a
4-token stored distribution). ``Scheduler.schedule()`` returns one complete :class:`StepPlan` without
side effects; the executor carries it out. What is admitted in which order, who grows, who is
preempted, who fails, how a prefill is chunked, what is restored or recomputed, what waits, and
which search has the turn: every field of the plan."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from types import SimpleNamespace

import torch

from arbor_runtime.engine.executor import Executor
from arbor_runtime.engine.scheduler import PAGE, Request, Scheduler
from arbor_runtime.engine.work import Account
from arbor_runtime.errors import KVBudgetExceeded
from arbor_runtime.generation import Row, StopChecker
from arbor_runtime.kv import BlockKV, KVStore
from arbor_runtime.kv.shape import KVShape
from arbor_runtime.memory import MemoryManager
from arbor_runtime.metrics import RuntimeMetrics
from arbor_runtime.planner import MemoryConfig, MemoryPlanner
from arbor_runtime.policies import ArborPolicy, FullPolicy, H2OPolicy
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import Node

SHAPE = KVShape(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))


class Bench:
    """A store, planner, memory manager, scheduler and executor over one policy; blocks and rows by hand."""

    def __init__(self, policy) -> None:
        config = MemoryConfig.of(policy)
        self.store = KVStore(SHAPE, capacity=config.kv_budget_tokens)
        self.nodes: dict[int, Node] = {}
        self.planner = MemoryPlanner(self.store, policy, config)
        self.memory = MemoryManager(self.store, policy, self.nodes, self.planner)
        self.sched = Scheduler(self.planner)
        self.failed: list[tuple[object, BaseException]] = []
        self.recomputed: list[Node] = []
        self.metrics = RuntimeMetrics()
        accounts = SimpleNamespace(
            accounting=lambda work: nullcontext(), targets=lambda work=None: [self.metrics], note_peak=lambda: None
        )
        prefiller = SimpleNamespace(recompute_all=self.recomputed.extend)
        self.executor = Executor(self.sched, self.memory, self.store, prefiller, accounts, self.fail)

    def node(self, parent: Node | None, n: int, stored: bool = True) -> Node:
        """A block of ``n`` tokens under ``parent``, its KV in the store (unless not ``stored``)."""
        start = 0 if parent is None else parent.end_pos
        node = Node(id=len(self.nodes), parent=parent, token_ids=list(range(n)), text="", kind="x", start_pos=start)
        node.tree_id = node.id if parent is None else parent.tree_id
        self.nodes[node.id] = node
        if stored:
            self.store.put(node.id, BlockKV.from_extents(self.store.pool.alloc(n), start, torch.zeros(4)))
        return node

    def row(self, owner: Node, max_new: int, started: float = 0.0, order: int = 0, account=None) -> Row:
        job = SimpleNamespace(started=started, name=f"job{started}", account=account)
        stop = StopChecker(None, SamplingParams(max_new_tokens=max_new, stop_at_eos=False), set())
        return Row(owner, 1000 + len(self.sched.waiting) + len(self.sched.running), order, 0, job=job, stop=stop)

    def fail(self, job, error: BaseException) -> None:
        """What the engine's fail does to the rows: the job's rows leave, their slots free."""
        self.failed.append((job, error))
        for row in self.sched.drop(job):
            for ext in row.extents:
                self.store.pool.free(ext)

    def running_full(self, owner: Node, max_new: int, started: float, account=None) -> Row:
        """A row decoding under ``owner`` that has filled its first page."""
        row = self.row(owner, max_new, started, account=account)
        row.add_slots(self.store.pool.alloc(PAGE))
        row.fed = PAGE
        self.sched.running.append(row)
        return row

    def step(self):
        """One step's memory: schedule (failed plans carried out first, as the engine does), carry out."""
        plan = self.sched.schedule()
        while plan.failed is not None:
            self.fail(plan.failed, plan.error)
            plan = self.sched.schedule()
        self.executor.step(plan)
        return plan

    def state(self) -> tuple:
        """Everything a plan could change: lists, pool, residency of every block, host tier."""
        blocks = tuple((i, tuple(self.store.get(i).kept.tolist())) for i in self.store.block_ids())
        return list(self.sched.waiting), list(self.sched.running), self.store.pool.used, blocks, self.store.host_tokens


def test_rows_are_admitted_in_queue_order_while_they_fit_and_the_plan_changes_nothing():
    bench = Bench(FullPolicy(budget_tokens=40))
    root = bench.node(None, 20)
    rows = [bench.row(root, 16, order=i) for i in range(4)]
    bench.sched.enqueue(rows)
    before = bench.state()
    plan = bench.sched.schedule()
    # 20 path tokens + 8 + 8 = 36 fit in 40; a third row's first page would not
    assert plan.admitted == rows[:2] and plan.job is rows[0].job and plan.failed is None
    assert (plan.admit.rows, plan.admit.need, plan.admit.whole, plan.admit.recompute) == (2, 16, False, ())
    assert [r for r, _ in plan.waited] == rows[:2] and all(s >= 0 for _, s in plan.waited)
    assert plan.growth == []
    assert bench.state() == before and bench.sched.schedule().admitted == rows[:2]  # no side effects
    bench.executor.step(plan)
    assert bench.sched.running == rows[:2] and bench.sched.waiting == rows[2:] and bench.store.pool.used == 36
    assert all(len(r.tokens) == 1 and r.capacity == PAGE for r in rows[:2])  # first token sampled, first page
    again = bench.sched.schedule()  # rows are running: the others wait, nobody fails
    assert again.admitted == [] and again.failed is None and not bench.failed


def test_a_lone_row_that_cannot_fit_fails_naming_need_and_budget_and_the_next_head_is_planned():
    bench = Bench(FullPolicy(budget_tokens=24))
    root = bench.node(None, 20)
    big, small = bench.row(root, 16, started=1.0), bench.row(root, 4, started=2.0)
    bench.sched.enqueue([big, small])
    plan = bench.sched.schedule()
    assert plan.failed is big.job and plan.admitted == [] and plan.growth == []
    assert (plan.error.needed, plan.error.budget) == (28, 24)  # its path (20) and its first page (8)
    assert "needs 28 resident tokens" in str(plan.error) and "budget_tokens=24" in str(plan.error)
    assert bench.sched.waiting == [big, small] and not bench.failed  # deciding failed nothing
    plan = bench.step()
    [(job, error)] = bench.failed
    assert job is big.job and isinstance(error, KVBudgetExceeded)
    assert plan.admitted == [small] and bench.sched.running == [small]  # 20 + 4 fits


def test_the_growth_ladder_preempts_the_youngest_row_when_the_policy_cannot_make_room():
    bench = Bench(FullPolicy(budget_tokens=40))
    root = bench.node(None, 20)
    old = bench.running_full(root, 32, started=1.0)
    young = bench.running_full(root, 32, started=2.0)
    waiting = bench.row(root, 32, started=3.0)
    bench.sched.enqueue([waiting])
    plan = bench.sched.schedule()
    # both need a page (16 slots), 4 are free and full frees nothing: the youngest gives way, then the
    # oldest tries alone (and would fail with its whole need if even that did not fit)
    assert plan.admitted == [] and len(plan.growth) == 2
    first, alone = plan.growth
    assert (first.grown, first.need, first.ahead, first.owners) == ([(old, PAGE), (young, PAGE)], 16, 16, [root, root])
    assert first.victim is young and first.error is None and not first.below_floor and first.job is old.job
    assert (alone.grown, alone.need, alone.ahead, alone.victim) == ([(old, PAGE)], 8, 8, None)
    assert alone.error.needed == 20 + 32 and not alone.below_floor  # full does not degrade
    bench.executor.step(plan)
    assert young.extents == [] and young.fed == 0 and old.capacity == 2 * PAGE
    assert bench.sched.running == [old] and bench.sched.waiting == [young, waiting]  # back in its place by job start
    assert bench.store.pool.used == 20 + 2 * PAGE and not bench.failed
    assert (bench.metrics.preemptions, bench.metrics.preempted_tokens) == (1, PAGE)
    assert bench.sched.reserve() == 32 - 2 * PAGE  # what the running row may still decode: on-demand restores leave it


def test_a_lone_row_that_cannot_grow_fails_with_its_whole_need():
    bench = Bench(FullPolicy(budget_tokens=30))
    root = bench.node(None, 20)
    row = bench.running_full(root, 32, started=1.0)
    [alone] = bench.sched.schedule().growth
    assert alone.victim is None and (alone.error.needed, alone.error.budget) == (20 + 32, 30)
    bench.step()
    [(job, error)] = bench.failed
    assert job is row.job and str(error) == str(alone.error) and bench.sched.running == []


def test_growth_under_an_evicting_policy_makes_room_instead_of_preempting():
    bench = Bench(H2OPolicy(budget_tokens=48))
    other = bench.node(None, 24)  # another tree: inactive, the policy may evict from it
    root = bench.node(None, 8)
    rows = [bench.running_full(root, 32, started=float(i)) for i in range(2)]
    plan = bench.step()
    assert [r for r, _ in plan.growth[0].grown] == rows and all(r.capacity == 2 * PAGE for r in rows)
    assert bench.metrics.preemptions == 0 and bench.sched.running == rows
    assert bench.store.get(other.id).kept_tokens < 24 and bench.store.pool.used <= 48


def test_a_lone_row_under_arbor_grows_below_the_floor_instead_of_failing():
    bench = Bench(ArborPolicy(budget_tokens=40))
    root = bench.node(None, 20)
    mid = bench.node(root, 10)
    row = bench.running_full(mid, 24, started=1.0)  # path 30 + 8 in flight: the next page does not fit whole
    [alone] = bench.sched.schedule().growth
    assert alone.below_floor and alone.error.needed == 30 + 24
    bench.step()
    assert not bench.failed and row.capacity == 2 * PAGE and bench.store.pool.used <= 40
    assert bench.store.host_tokens > 0  # part of the path waits on the host tier


def test_keep_active_whole_restores_the_path_and_plans_the_dropped_blocks_for_recompute():
    bench = Bench(ArborPolicy(budget_tokens=64))
    root = bench.node(None, 16)
    mid = bench.node(root, 12)
    leaf = bench.node(mid, 10)
    bench.store.apply(mid.id, torch.arange(4), offload=True)  # 8 tokens to the host tier
    bench.store.apply(leaf.id, torch.arange(6), offload=False)  # 4 tokens gone from every tier
    row = bench.row(leaf, 16)
    bench.sched.enqueue([row])
    before = bench.state()
    plan = bench.sched.schedule()
    assert (plan.admit.rows, plan.admit.need, plan.admit.whole) == (1, PAGE + 8 + 4, True)
    assert plan.admit.recompute == (leaf,) and plan.admit.active == {root.id, mid.id, leaf.id}
    assert bench.state() == before  # planning moved nothing
    bench.executor.step(plan)
    assert plan.admitted == [row] and bench.recomputed == [leaf]
    assert bench.store.get(mid.id).whole and bench.store.get(leaf.id).kept_tokens == 6  # the rest is recomputed


def test_below_its_floor_a_lone_row_is_admitted_with_its_pinned_tokens():
    bench = Bench(ArborPolicy(budget_tokens=40))
    root = bench.node(None, 24)
    mid = bench.node(root, 16)
    row = bench.row(mid, 16)
    bench.sched.enqueue([row])
    plan = bench.sched.schedule()  # path 40 + a page: never whole in 40
    assert plan.admitted == [row] and plan.admit.pinned is not None and not plan.admit.whole
    assert plan.admit.pinned[mid.id].tolist() == list(range(16))  # the frontier block stays whole
    bench.executor.step(plan)
    assert bench.store.get(mid.id).whole and bench.store.pool.used <= 40 and bench.recomputed == []


def test_a_prefill_is_chunked_under_a_policy_that_shrinks_the_active_path():
    bench = Bench(H2OPolicy(budget_tokens=32))  # chunks of 32 // 4 = 8
    root = bench.node(None, 20)
    child = bench.node(root, 30, stored=False)
    plan = bench.sched.plan_work(Request(child, 30, "prefill"), None)
    assert (plan.admit.rows, plan.slots, plan.admit.recompute, plan.error) == (1, 8, (), None)
    assert bench.executor.work(plan, child) == 8
    # below its floor arbor prefills in chunks too (the path token-extracted, to the host)
    arbor = Bench(ArborPolicy(budget_tokens=32))
    root = arbor.node(None, 20)
    child = arbor.node(root, 30, stored=False)
    plan = arbor.sched.plan_work(Request(child, 30, "prefill"), None)
    assert (plan.admit.rows, plan.slots) == (1, 8)
    arbor.executor.work(plan, child)
    assert arbor.store.pool.used <= 32 - 8 and arbor.store.host_tokens == 20 - arbor.store.resident_tokens
    # all-or-nothing arbor cannot shrink the active path: alone, the block can never fit
    arbor = Bench(ArborPolicy(budget_tokens=32, degrade=False))
    root = arbor.node(None, 20)
    child = arbor.node(root, 30, stored=False)
    plan = arbor.sched.plan_work(Request(child, 30, "prefill"), None)
    assert plan.admit.rows == 0 and not plan.wait
    assert str(plan.error) == "KV budget exceeded during prefill: needs 50 resident tokens, budget_tokens=32"


def test_a_choose_pass_is_never_cut_and_fails_naming_its_kind():
    bench = Bench(H2OPolicy(budget_tokens=32))
    root = bench.node(None, 20)
    plan = bench.sched.plan_work(Request(root, 40, "choose"), None)  # alone, 40 kept tokens cannot fit
    assert plan.slots == 40 and plan.admit.rows == 0 and "during choose: needs 60" in str(plan.error)


def test_a_prefill_or_choose_that_does_not_fit_waits_while_rows_run():
    bench = Bench(FullPolicy(budget_tokens=40))
    root = bench.node(None, 20)
    bench.running_full(root, 32, started=1.0)
    for kind in ("prefill", "choose"):
        plan = bench.sched.plan_work(Request(root, 16, kind), None)
        assert plan.wait and plan.error is None and plan.slots == 16


def test_searches_without_the_turn_wait_and_give_way_first():
    bench = Bench(FullPolicy(budget_tokens=64))
    root = bench.node(None, 20)
    mine, theirs = Account(), Account()
    demand = {id(a): (a, [(root, 24)]) for a in (mine, theirs)}  # 44 each: one at a time
    bench.sched.take_turns(demand)
    assert bench.sched.turns.contended and bench.sched.turns.admits(mine) and not bench.sched.turns.admits(theirs)
    waiting = [bench.row(root, 16, account=theirs), bench.row(root, 16, account=mine, order=1)]
    bench.sched.enqueue(waiting)
    assert bench.sched.schedule().admitted == [waiting[1]]  # theirs waits for the turn
    assert bench.sched.plan_work(Request(root, 4, "prefill"), theirs).wait
    assert bench.sched.plan_work(Request(root, 4, "prefill"), mine).admit.rows == 1
    # a preemption costs a search without the turn first, even with more decoded
    a = bench.running_full(root, 32, started=1.0, account=mine)
    b = bench.running_full(root, 32, started=2.0, account=theirs)
    b.fed += 2
    assert bench.sched.victim([a, b]) is b


def test_the_scheduler_never_plans_past_the_budget():
    """Many rows of two trees decoding to the end under an evicting policy: every step's admissions
    and pages fit (the pool, which refuses any slot past its capacity, never has to)."""
    bench = Bench(H2OPolicy(budget_tokens=64))
    roots = [bench.node(None, 12), bench.node(None, 10)]
    rows = [bench.row(roots[i % 2], 20, started=float(i), order=i) for i in range(6)]
    bench.sched.enqueue(rows)
    finished = []
    for _ in range(40):
        bench.step()
        assert bench.store.pool.used <= 64
        for row in list(bench.sched.running):  # one "decode step": a token per row
            row.fed += 1
            if row.fed == row.stop.params.max_new_tokens:
                bench.sched.running.remove(row)
                for ext in row.extents:
                    bench.store.pool.free(ext)
                finished.append(row)
        if not bench.sched.running and not bench.sched.waiting:
            break
    assert sorted(r.order for r in finished) == list(range(6)) and not bench.failed


def test_the_growth_ladder_preempts_in_the_order_victim_picks_again_and_again():
    """The ladder works its preemption order out once (``victims``); it must be the order of picking
    :meth:`Scheduler.victim` among what is left, rung after rung, with rows of a search without the turn
    first, then the fewest decoded, then the youngest; each rung's rows and room are what is left. Rows
    are told apart by identity (two rows with equal fields are not the same row)."""
    bench = Bench(FullPolicy(budget_tokens=4096))
    root = bench.node(None, 8)
    mine, theirs = Account(), Account()
    bench.sched.take_turns({id(a): (a, [(root, 4000)]) for a in (mine, theirs)})
    rows = [bench.running_full(root, 64, started=float(i % 3), account=(mine, theirs)[i % 2]) for i in range(9)]
    for i, row in enumerate(rows):
        row.fed += (7 * i) % 4  # ties in fed, so the youngest decides among them
    ladder = bench.sched.growth(bench.sched.running)
    left, expected = list(rows), []
    while len(left) > 1:  # the rule itself, row by row: no turn first, then fewest decoded, then youngest
        ranked = [(bench.sched.turns.admits(r.job.account), r.fed, len(left) - 1 - i) for i, r in enumerate(left)]
        expected.append(left[min(range(len(left)), key=ranked.__getitem__)])
        assert bench.sched.victim(left) is expected[-1]
        left = [r for r in left if r is not expected[-1]]
    assert [rung.victim for rung in ladder] == [*expected, None]
    for k, rung in enumerate(ladder):
        kept = [r for r in rows if all(r is not v for v in expected[:k])]
        assert [r for r, _ in rung.grown] == kept and rung.owners == [r.owner for r in kept]
        assert rung.need == sum(n for _, n in rung.grown) and rung.ahead == PAGE * len(kept)
    row = bench.row(root, 64)
    assert copy.copy(row) != row and row == row  # a copy holds the same fields and is another row
