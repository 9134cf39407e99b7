"""Below its floor arbor degrades instead of refusing (issue 44), and above it nothing changes.

The floor of a policy that keeps the active path whole is the longest active path plus a row's new
tokens. At and above it, degrading arbor builds the same trees with the same rehydrations as the
paper's all-or-nothing arbor (``degrade=False``). Below it, the search runs inside the budget: the
planner pins the root's sinks, the frontier block, the prompt outside its few-shot examples and the
frontier's parent (as room allows), arbor keeps the rest of the path by value, and what leaves the
device waits on the host tier and comes back bit-identical.
"""

from __future__ import annotations

import pytest
import torch
from test_budget import walked_kv_bytes

from arbor_runtime import KVBudgetExceeded, Runtime, SamplingParams, build_policy
from arbor_runtime.kv import BlockKV, KVStore
from arbor_runtime.kv.shape import KVShape
from arbor_runtime.planner import MemoryConfig, MemoryPlanner
from arbor_runtime.policies import ArborPolicy, RandomPolicy
from arbor_runtime.policies.base import BlockView, MemoryView
from arbor_runtime.tree import GENERATED, PROMPT, Node

INSTRUCTION = "Use the four numbers and + - * / to make 24.\n"
EXAMPLES = "".join(f"Input: {a} {a} 2 3\nAnswer: ({a} + {a}) * 2 * 3 = 24\n" for a in range(1, 7))
QUESTION = "Input: 4 4 6 8\nSteps:\n"
PROMPT_TEXT = INSTRUCTION + EXAMPLES + QUESTION
SPAN = (len(INSTRUCTION), len(INSTRUCTION) + len(EXAMPLES))
PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0, top_k=20, seed=5, stop_at_eos=False)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def search(rt: Runtime) -> list[Node]:
    """A small search that goes deep and comes back: root, 2 children, a chain under the first, then
    the second child expanded (a branch switch back to a shallow path). Returns every node made."""
    root = rt.new_tree(PROMPT_TEXT, examples=SPAN)
    a, b = rt.expand(root, 2, PARAMS)
    (c,) = rt.expand(a, 1, PARAMS)
    (d,) = rt.expand(c, 1, PARAMS)
    e = rt.append(d, " (left: 24)")
    (f,) = rt.expand(e, 1, PARAMS)
    rt.expand(b, 2, PARAMS)
    return list(rt.table.all.values())


def signature(nodes: list[Node]) -> list[tuple]:
    return [(n.id, n.parent.id if n.parent else None, tuple(n.token_ids)) for n in nodes]


def counters(rt: Runtime) -> tuple:
    m = rt.metrics
    return m.rehydrations, m.rehydrated_tokens, m.evicted_tokens, m.recomputed_tokens, m.peak_device_tokens


def arbor(tiny, budget: int, **kw) -> Runtime:
    return Runtime(tiny, policy=build_policy("arbor", budget_tokens=budget, **kw))


def floor_of(tiny) -> int:
    """The least budget at which the all-or-nothing arbor completes :func:`search` (bisected between
    the prompt, which cannot be enough, and full's peak, which is)."""
    full = Runtime(tiny, policy="full")
    nodes = search(full)
    low, high = nodes[0].length, full.metrics.peak_device_tokens
    while high - low > 1:
        mid = (low + high) // 2
        try:
            search(arbor(tiny, mid, degrade=False))
            high = mid
        except KVBudgetExceeded:
            low = mid
    return high


def test_at_and_above_the_floor_degrading_changes_nothing(tiny):
    floor = floor_of(tiny)
    full = Runtime(tiny, policy="full")
    reference = signature(search(full))
    for budget in (floor, floor + 3, floor + 20):
        strict, degrading = arbor(tiny, budget, degrade=False), arbor(tiny, budget)
        assert signature(search(strict)) == signature(search(degrading)) == reference  # full's tree, exactly
        assert counters(strict) == counters(degrading)  # the same evictions and rehydrations


def test_below_the_floor_the_search_runs_inside_the_budget_and_keeps_what_it_pins(tiny):
    rt = arbor(tiny, 96)
    pins, walked = [], []
    forward = rt.backend.forward

    def watched(batch, *args, **kwargs):
        walked.append(walked_kv_bytes(rt, batch))
        for row in rt.engine.running:  # decode steps: what the row's path holds on the device now
            pins.append(pinned_resident(rt, row.owner))
        return forward(batch, *args, **kwargs)

    rt.backend.forward = watched
    nodes = search(rt)
    root = nodes[0]
    assert root.length > 96  # the prompt alone is over the budget: prefilled in chunks
    assert len(nodes) == len(signature(search(Runtime(tiny, policy="full"))))  # every operation ran
    m = rt.metrics
    assert m.peak_device_tokens <= 96 and max(walked) <= 96 * rt.backend.shape.bytes_per_token
    assert rt.store.pool.nbytes == 96 * rt.backend.shape.bytes_per_token  # the pool is the budget
    assert m.dropped_tokens == 0 and m.evicted_tokens > 0 and m.rehydrated_tokens > 0
    assert pins and all(pins)  # sinks, instruction and question, frontier and its parent at every step


def pinned_resident(rt: Runtime, owner: Node) -> bool:
    """Are the owner's root sinks and its prompt outside the examples, the owner and its parent on the device?"""
    root = owner.path()[0]
    kept = set(rt.store.get(root.id).kept.tolist())
    start, end = root.examples
    must = set(range(4)) | set(range(start)) | set(range(end, root.length))
    blocks = [n for n in owner.path()[1:]][-2:]
    return must <= kept and all(rt.store.get(n.id).whole for n in blocks)


def test_spans_evicted_below_the_floor_come_back_bit_identical(tiny):
    """A chain deeper than the budget extracts the root to the host; the shallower branch after it
    fits whole, so the root comes back whole: its K/V equal what was evicted, bit for bit."""
    rt = arbor(tiny, 260)
    root = rt.new_tree(PROMPT_TEXT, examples=SPAN)
    assert root.length < 260 - 2 * PARAMS.max_new_tokens
    snapshot = whole_kv(rt, root)
    a, b = rt.expand(root, 2, PARAMS)
    node = a
    while rt.store.host_count(root.id) == 0:  # deeper until the path does not fit whole
        (node,) = rt.expand(node, 1, PARAMS)
    assert rt.metrics.peak_device_tokens <= 260
    rt.expand(b, 1, PARAMS)  # b's path fits whole again: made whole before it runs
    assert rt.store.get(root.id).whole and rt.store.host_count(root.id) == 0
    for got, want in zip(whole_kv(rt, root), snapshot, strict=True):
        assert torch.equal(got, want)


def whole_kv(rt: Runtime, node: Node) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of a whole block's K/V in token order: (L, H_kv, T, D) each."""
    blk = rt.store.get(node.id)
    assert blk.whole
    return rt.store.pool.read(blk.slots_of(torch.arange(blk.length)))


def test_examples_are_marked_in_tokens_and_recorded_for_replay(tiny):
    rt = Runtime(tiny, policy="full")
    root = rt.new_tree(PROMPT_TEXT, examples=SPAN)
    start, end = root.examples
    text = rt.tokenizer.decode(root.token_ids[start:end])
    assert text.strip().startswith("Input: 1 1 2 3") and text.strip().endswith("= 24")
    assert rt.tokenizer.decode(root.token_ids[end:]).endswith(QUESTION)
    assert rt.oplog[0]["examples"] == [start, end]
    with pytest.raises(ValueError, match=r"examples=\(5, 1\) must satisfy 0 <= start <= end"):
        rt.new_tree(PROMPT_TEXT, examples=(5, 1))


# ---- the planner's pins, on plain bookkeeping ------------------------------------------------------------
SHAPE = KVShape(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))


def chain(store: KVStore, lengths: list[int], examples: tuple[int, int]) -> list[Node]:
    """A root prompt and a chain of generated blocks below it, each stored whole."""
    nodes, start = [], 0
    for i, n in enumerate(lengths):
        kind = PROMPT if i == 0 else GENERATED
        node = Node(id=i, parent=nodes[-1] if nodes else None, token_ids=list(range(n)), text="", kind=kind,
                    start_pos=start)  # fmt: skip
        store.put(node.id, BlockKV.from_extents(store.pool.alloc(n), start, torch.zeros(4)))
        nodes.append(node)
        start += n
    nodes[0].examples = examples
    return nodes


@pytest.mark.parametrize(
    ("budget", "want"),
    [
        # room 100 - 10 = 90: sinks 4, frontier 20, prompt outside [10, 50) 20 (4 of them sinks), parent 15
        (100, {0: [*range(10), *range(50, 60)], 3: list(range(20)), 2: list(range(15))}),
        # room 40: sinks, frontier (24); the prompt part (16 more) fits exactly; the parent does not
        (50, {0: [*range(10), *range(50, 60)], 3: list(range(20))}),
        # room 30: sinks, frontier; the prompt part (16) does not fit, the parent (15) does not either
        (40, {0: [0, 1, 2, 3], 3: list(range(20))}),
        # room 10: the frontier does not fit; the sinks still do
        (20, {0: [0, 1, 2, 3]}),
    ],
)
def test_the_planner_pins_sinks_frontier_prompt_and_parent_in_that_order_as_room_allows(budget, want):
    store = KVStore(SHAPE, capacity=200)
    nodes = chain(store, [60, 30, 15, 20], examples=(10, 50))
    planner = MemoryPlanner(store, ArborPolicy(), MemoryConfig(budget_tokens=budget))
    pinned = planner.pinned([nodes[-1]], need=10)
    assert {b: idx.tolist() for b, idx in pinned.items()} == want


def test_nothing_fits_when_the_rows_own_tokens_do_not():
    store = KVStore(SHAPE, capacity=200)
    nodes = chain(store, [60, 30], examples=(10, 50))
    assert MemoryPlanner(store, ArborPolicy(), MemoryConfig(budget_tokens=20)).pinned([nodes[-1]], need=21) is None


def test_arbors_plan_below_the_floor_keeps_the_pinned_and_the_best_of_the_rest_device_or_host():
    store = KVStore(SHAPE, capacity=200)
    nodes = chain(store, [40, 20], examples=(4, 40))
    blk = store.get(0)
    blk.attention = torch.arange(40, dtype=torch.float32)  # later tokens valued more
    blk.observers = 1.0
    store.apply(0, torch.arange(30), offload=True)  # the last 10 on the host: the best ones
    views = [BlockView(nodes[0], blk, True, hosted=store.host.indices(0)), BlockView(nodes[1], store.get(1), True)]
    pinned = {0: torch.arange(4), 1: torch.arange(20)}
    view = MemoryView(views, frozenset({0, 1}), 200, target=34, pinned=pinned)
    plan = ArborPolicy(budget_tokens=200).plan(view)
    assert plan.keep[0].tolist() == [0, 1, 2, 3, *range(30, 40)]  # pinned + the 10 best, from the host
    assert plan.keep[1].tolist() == list(range(20))


def test_random_keeps_sinks_and_a_recent_window_and_draws_the_rest_by_seed():
    store = KVStore(SHAPE, capacity=200)
    nodes = chain(store, [100], examples=(0, 0))
    view = MemoryView([BlockView(nodes[0], store.get(0), False)], frozenset(), 200, target=40)
    plans = [RandomPolicy(budget_tokens=200, seed=s).plan(view).keep[0].tolist() for s in (0, 0, 1)]
    assert plans[0] == plans[1] != plans[2]  # seeded: the same seed draws the same tokens
    for kept in plans:
        assert len(kept) == 40 and {0, 1, 2, 3} <= set(kept) and set(range(96, 100)) <= set(kept)


# ---- attention statistics only under pressure (issue 46) --------------------------------------------------
def observed(rt: Runtime) -> float:
    """Queries counted over every stored block (each block's ``observers``)."""
    return sum(rt.store.get(i).observers for i in rt.store.block_ids())


@pytest.mark.parametrize(("policy", "budget", "prefill", "decode"), [
    ("arbor", None, False, False),  # nothing is ever evicted: no plan would read them
    ("arbor", 4000, False, False),  # far from the floor all search long
    ("arbor", 430, False, False),  # the prompt twice (210 x 2) and a row's path + 2 thoughts under the budget
    ("arbor", 260, True, False),  # both rows fit whole (210 + 2 x 10): the tree is full's whatever a plan
    # keeps, but the prompt twice would not (the next operation of its size): its prefill is scored
    ("arbor", 230, True, True),  # a lone row's path + its thought + one more thought reach the budget
    ("h2o", None, True, True),  # tree-blind scorers rank by the whole history: always
])  # fmt: skip
def test_arbor_records_attention_statistics_only_near_its_floor(tiny, policy, budget, prefill, decode):
    rt = Runtime(tiny, policy=policy, budget_tokens=budget)
    root = rt.new_tree(PROMPT_TEXT, examples=SPAN)
    assert (rt.store.get(root.id).observers > 0) is prefill
    kids = rt.expand(root, 2, PARAMS)
    assert all(rt.store.get(k.id).observers > 0 for k in kids) is decode  # a child's own queries, when scored
    assert any(rt.store.get(k.id).attention.sum() > 0 for k in kids) is decode


def test_statistics_switch_on_one_operation_ahead_of_the_floor(tiny):
    """The planner's rule: some entry's whole path + its slots, + the largest entry's slots again, >= budget."""
    rt = Runtime(tiny, policy="arbor", budget_tokens=1000)
    planner = rt.memory.planner
    root = rt.new_tree(PROMPT_TEXT, examples=SPAN)  # 210 tokens
    assert root.length == 210
    assert not planner.records_statistics([])
    assert planner.records_statistics([(root, 395)]) and not planner.records_statistics([(root, 394)])
    # the lone need is per entry (rows take turns before any of them degrades), the horizon the largest slots
    assert not planner.records_statistics([(root, 300), (root, 300)][:1] + [(None, 100)])
    assert planner.records_statistics([(root, 100), (None, 500)])
    assert not Runtime(tiny, policy="arbor").memory.planner.records_statistics([(root, 10_000)])  # no budget


def test_a_block_no_scored_query_saw_keeps_its_tail():
    """Statistics off (no pressure yet): arbor's plan keeps an unobserved inactive block's newest tokens
    in one run, not an arbitrary pick among tied zero scores."""
    store = KVStore(SHAPE, capacity=200)
    nodes = chain(store, [40, 30, 20], examples=(4, 40))
    views = [BlockView(n, store.get(n.id), n.id != 1) for n in nodes]  # block 1 inactive, never observed
    view = MemoryView(views, frozenset({0, 2}), 200, target=60 + 10)
    plan = ArborPolicy(budget_tokens=200, tail_tokens=2).plan(view)
    assert plan.keep[1].tolist() == list(range(20, 30))


# ---- the floor a run measures (issue 46: the overhead benchmark's floor) ----------------------------------
def test_floor_tokens_is_the_largest_operation_of_the_run(tiny):
    """``metrics.floor_tokens``: the most slots one operation needed alone, path whole plus its slots: a
    decode row's whole thought, a choose pass's kept choices together (not one thought: two kept
    choices of a pass are written in one forward)."""
    rt = Runtime(tiny, policy="full")
    root = rt.new_tree(PROMPT_TEXT, examples=SPAN)
    rt.expand(root, 2, PARAMS)
    assert rt.metrics.floor_tokens == 210 + PARAMS.max_new_tokens  # each row alone: path + its thought
    kept = rt.choose(root, ["one two three four five six", "seven eight nine ten eleven"], keep=2).kept
    assert rt.metrics.floor_tokens == 210 + sum(k.length for k in kept) > 210 + PARAMS.max_new_tokens


def test_arbor_at_the_measured_floor_rebuilds_fulls_tree(tiny):
    """At ``floor_tokens`` of full's run every operation fits whole: arbor's tree is full's token for token
    (a choose pass's kept choices included), with the statistics off until the floor is one operation away."""

    def search(rt):
        root = rt.new_tree(PROMPT_TEXT, examples=SPAN)
        kids = rt.expand(root, 2, PARAMS)
        kept = rt.choose(kids[0], ["one two three four five six", "seven eight nine ten"], keep=2).kept
        rt.expand(kept[1], 2, PARAMS)
        rt.expand(kids[1], 2, PARAMS)
        return {n.id: list(n.token_ids) for n in rt.all_nodes.values()}

    ref = Runtime(tiny, policy="full")
    tree = search(ref)
    floor = ref.metrics.floor_tokens
    assert floor < ref.metrics.peak_device_tokens  # a real budget: the search needs evictions under it
    rt = Runtime(tiny, policy="arbor", budget_tokens=floor)
    assert search(rt) == tree
    assert rt.metrics.evicted_tokens > 0 and rt.metrics.peak_device_tokens <= floor
