"""The scheduler and the memory planner on plain bookkeeping: a real KVStore of a tiny KV shape, real
policies, rows and nodes made by hand, no model. What is admitted in which order, who grows, who is
preempted, how a prefill is chunked, what is restored or recomputed, what waits and what fails."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from arbor_runtime.engine.scheduler import PAGE, Scheduler
from arbor_runtime.errors import KVBudgetExceeded, NotYet
from arbor_runtime.generation import Row
from arbor_runtime.kv import BlockKV, KVStore
from arbor_runtime.kv.shape import KVShape
from arbor_runtime.memory import MemoryManager
from arbor_runtime.policies import ArborPolicy, FullPolicy, H2OPolicy
from arbor_runtime.tree import Node

SHAPE = KVShape(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))


class Bench:
    """A store, a memory manager and a scheduler over one policy; blocks and rows made by hand."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.store = KVStore(SHAPE, capacity=policy.kv_budget_tokens)
        self.nodes: dict[int, Node] = {}
        self.memory = MemoryManager(self.store, policy, self.nodes)
        self.failed: list[tuple[object, BaseException]] = []
        self.sched = Scheduler(self.memory, policy, lambda work: nullcontext(), self.fail)
        self.planner = self.memory.planner

    def node(self, parent: Node | None, n: int, stored: bool = True) -> Node:
        """A block of ``n`` tokens under ``parent``, its KV in the store (unless not ``stored``)."""
        start = 0 if parent is None else parent.end_pos
        node = Node(id=len(self.nodes), parent=parent, token_ids=list(range(n)), text="", kind="x", start_pos=start)
        node.tree_id = node.id if parent is None else parent.tree_id
        self.nodes[node.id] = node
        if stored:
            self.store.put(node.id, BlockKV.from_extents(self.store.pool.alloc(n), start, torch.zeros(4)))
        return node

    def row(self, owner: Node, max_new: int, started: float = 0.0, order: int = 0) -> Row:
        job = SimpleNamespace(started=started, name=f"job{started}")
        stop = SimpleNamespace(params=SimpleNamespace(max_new_tokens=max_new))
        return Row(owner, 1000 + len(self.sched.waiting) + len(self.sched.running), order, 0, job=job, stop=stop)

    def fail(self, job, error: BaseException) -> None:
        """What the engine's fail does to the scheduler's lists: the job's rows leave, their slots free."""
        self.failed.append((job, error))
        for row in [r for r in self.sched.running if r.job is job]:
            self.sched.running.remove(row)
            for ext in row.extents:
                self.store.pool.free(ext)
        self.sched.waiting[:] = [r for r in self.sched.waiting if r.job is not job]

    def start(self, plan) -> None:
        """What the engine does with admitted rows: their first slots."""
        for row in plan.admitted:
            row.add_slots(self.store.pool.alloc(min(PAGE, row.stop.params.max_new_tokens)))

    def running_full(self, owner: Node, max_new: int, started: float) -> Row:
        """A row decoding under ``owner`` that has filled its first page."""
        row = self.row(owner, max_new, started)
        row.add_slots(self.store.pool.alloc(PAGE))
        row.fed = PAGE
        self.sched.running.append(row)
        return row


def test_rows_are_admitted_in_queue_order_while_they_fit_and_the_rest_wait():
    bench = Bench(FullPolicy(budget_tokens=40))
    root = bench.node(None, 20)
    rows = [bench.row(root, 16, order=i) for i in range(4)]
    bench.sched.waiting.extend(rows)
    plan = bench.sched.schedule()
    # 20 path tokens + 8 + 8 = 36 fit in 40; a third row's first page would not
    assert plan.admitted == rows[:2] and bench.sched.running == rows[:2] and bench.sched.waiting == rows[2:]
    assert bench.store.pool.used == 20  # the scheduler decided; the slots are the engine's to take
    bench.start(plan)
    assert bench.store.pool.used == 36 and not bench.failed
    again = bench.sched.schedule()  # rows are running: the others wait, nobody fails
    assert again.admitted == [] and bench.sched.waiting == rows[2:] and not bench.failed


def test_a_lone_row_that_cannot_fit_fails_naming_need_and_budget_and_the_next_head_is_tried():
    bench = Bench(FullPolicy(budget_tokens=24))
    root = bench.node(None, 20)
    big, small = bench.row(root, 16, started=1.0), bench.row(root, 4, started=2.0)
    bench.sched.waiting.extend([big, small])
    plan = bench.sched.schedule()
    [(job, error)] = bench.failed
    assert job is big.job and isinstance(error, KVBudgetExceeded)
    assert (error.needed, error.budget) == (28, 24)  # its path (20) and its first page (8)
    assert "needs 28 resident tokens" in str(error) and "budget_tokens=24" in str(error)
    assert plan.admitted == [small]  # 20 + 4 fits


def test_growth_preempts_the_youngest_row_when_the_policy_cannot_make_room():
    bench = Bench(FullPolicy(budget_tokens=40))
    root = bench.node(None, 20)
    old = bench.running_full(root, 32, started=1.0)
    young = bench.running_full(root, 32, started=2.0)
    waiting = bench.row(root, 32, started=3.0)
    bench.sched.waiting.append(waiting)
    plan = bench.sched.grow(bench.sched.schedule())
    # both need a page (16 slots), 4 are free and full frees nothing: the youngest gives way
    assert plan.preempted == [young] and young.extents == [] and young.fed == 0
    assert plan.grown == [(old, PAGE)] and bench.sched.running == [old]
    assert bench.sched.waiting == [young, waiting]  # back in its place by job start
    assert bench.store.pool.used == 28 and not bench.failed


def test_a_lone_row_that_cannot_grow_fails_with_its_whole_need():
    bench = Bench(FullPolicy(budget_tokens=30))
    root = bench.node(None, 20)
    row = bench.running_full(root, 32, started=1.0)
    plan = bench.sched.grow(bench.sched.schedule())
    [(job, error)] = bench.failed
    assert job is row.job and (error.needed, error.budget) == (20 + 32, 30)
    assert plan.grown == [] and plan.preempted == [] and bench.sched.running == []


def test_growth_under_an_evicting_policy_makes_room_instead_of_preempting():
    bench = Bench(H2OPolicy(budget_tokens=48))
    other = bench.node(None, 24)  # another tree: inactive, the policy may evict from it
    root = bench.node(None, 8)
    rows = [bench.running_full(root, 32, started=float(i)) for i in range(2)]
    plan = bench.sched.grow(bench.sched.schedule())
    assert plan.preempted == [] and [r for r, _ in plan.grown] == rows
    assert bench.store.get(other.id).kept_tokens < 24 and bench.planner.has_free(2 * PAGE)
    assert bench.store.pool.used <= 48


def test_a_prefill_is_chunked_under_a_policy_that_shrinks_the_active_path():
    bench = Bench(H2OPolicy(budget_tokens=32))  # chunks of 32 // 4 = 8
    root = bench.node(None, 20)
    child = bench.node(root, 30, stored=False)
    got = bench.sched.admit([(child, 30)], [], "prefill").required()
    assert (got.rows, got.slots, got.recompute) == (1, 8, [])
    # below its floor arbor prefills in chunks too (the path token-extracted, to the host)
    arbor = Bench(ArborPolicy(budget_tokens=32))
    root = arbor.node(None, 20)
    child = arbor.node(root, 30, stored=False)
    got = arbor.sched.admit([(child, 30)], [], "prefill").required()
    assert (got.rows, got.slots, got.recompute) == (1, 8, [])
    assert arbor.store.pool.used <= 32 - 8 and arbor.store.host_tokens == 20 - arbor.store.resident_tokens
    # all-or-nothing arbor cannot shrink the active path: alone, the block can never fit
    arbor = Bench(ArborPolicy(budget_tokens=32, degrade=False))
    root = arbor.node(None, 20)
    child = arbor.node(root, 30, stored=False)
    with pytest.raises(KVBudgetExceeded, match="during prefill: needs 50 resident tokens, budget_tokens=32"):
        arbor.sched.admit([(child, 30)], [], "prefill").required()


def test_a_prefill_or_choose_that_does_not_fit_waits_while_rows_run():
    bench = Bench(FullPolicy(budget_tokens=40))
    root = bench.node(None, 20)
    row = bench.running_full(root, 32, started=1.0)
    for kind in ("prefill", "choose"):
        got = bench.sched.admit([(root, 16)], [row.owner], kind)
        assert got.wait and got.error is None
        with pytest.raises(NotYet):
            got.required()


def test_keep_active_whole_restores_the_path_and_lists_dropped_blocks_for_recompute():
    bench = Bench(ArborPolicy(budget_tokens=64))
    root = bench.node(None, 16)
    mid = bench.node(root, 12)
    leaf = bench.node(mid, 10)
    bench.store.apply(mid.id, torch.arange(4), offload=True)  # 8 tokens to the host tier
    bench.store.apply(leaf.id, torch.arange(6), offload=False)  # 4 tokens gone from every tier
    used = bench.store.pool.used
    plan = bench.planner.admission([(leaf, PAGE)], [])
    assert (plan.rows, plan.need, plan.whole) == (1, PAGE + 8 + 4, True)
    assert bench.store.pool.used == used and bench.store.get(mid.id).kept_tokens == 4  # planning moved nothing
    row = bench.row(leaf, 16)
    bench.sched.waiting.append(row)
    step = bench.sched.schedule()
    assert step.admitted == [row] and step.recompute == [leaf]
    assert bench.store.get(mid.id).whole and bench.store.get(leaf.id).kept_tokens == 6


def test_the_scheduler_never_plans_past_the_budget():
    """Many rows of two trees decoding to the end under an evicting policy: every step's admissions
    and pages fit (the pool, which refuses any slot past its capacity, never has to)."""
    bench = Bench(H2OPolicy(budget_tokens=64))
    roots = [bench.node(None, 12), bench.node(None, 10)]
    rows = [bench.row(roots[i % 2], 20, started=float(i), order=i) for i in range(6)]
    bench.sched.waiting.extend(rows)
    finished = []
    for _ in range(40):
        plan = bench.sched.schedule()
        bench.start(plan)
        plan = bench.sched.grow(plan)
        for row, n in plan.grown:
            row.add_slots(bench.store.pool.alloc(n))
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
