"""API misuse is refused before anything changes, and a failed forward gives back what it took.

Each test is one reproduction from issue 21 ("API misuse loses data or leaks memory"): a node of
another runtime, a released node, token ids outside the vocabulary, a forward that raises,
non-finite sampling parameters and values. After each refused or failed call both runtimes hold
exactly what they held before, and the pool holds exactly the slots of the live nodes' blocks.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from arbor_runtime import ArborError, Node, Runtime, SamplingParams
from arbor_runtime.errors import NodeError, TokenIdError
from arbor_runtime.policies.allocation import fit_floors, water_fill

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, stop_at_eos=False)
SHORT = SamplingParams(max_new_tokens=4, temperature=0.0, stop_at_eos=False)
FIXED = {"temperature": 0.0, "stop_at_eos": False}


@pytest.fixture(autouse=True)
def threads(one_torch_thread):
    yield


def held_by_live_nodes(rt: Runtime) -> int:
    """Pool slots the live nodes' blocks hold (what ``pool.used`` must equal when nothing is in flight)."""
    assert set(rt.store.block_ids()) <= set(rt.nodes), "a block in the store belongs to no live node"
    return sum(rt.store.get(i).kept_tokens for i in rt.nodes if i in rt.store)


def snapshot(rt: Runtime) -> dict:
    """Everything a misused call could change: the node tables, flags, values, KV and the op log."""
    return {
        "live": sorted(rt.nodes),
        "all": sorted(rt.all_nodes),
        "released": {i: n.released for i, n in rt.all_nodes.items()},
        "values": {i: n.value for i, n in rt.all_nodes.items()},
        "children": {i: [c.id for c in n.children] for i, n in rt.all_nodes.items()},
        "blocks": {i: (rt.store.get(i).kept.tolist(), rt.store.host_count(i)) for i in rt.store.block_ids()},
        "resident": rt.store.resident_tokens,
        "pool_used": rt.store.pool.used,
        "oplog": len(rt.oplog),
        "next_id": rt._next_id,
    }


def three_nodes(rt: Runtime) -> tuple[Node, list[Node]]:
    """A root of 10 tokens and two 10-token children: 3 live nodes, 30 resident tokens."""
    root = rt.new_tree_ids(list(range(1, 11)))
    kids = rt.expand(root, 2, GREEDY)
    return root, kids


# ---- nodes of another runtime -----------------------------------------------------------------
CALLS = {
    "expand": lambda rt, n: rt.expand(n, 1, SHORT),
    "expand_many": lambda rt, n: rt.expand_many([(n, 1)], SHORT),
    "choose": lambda rt, n: rt.choose(n, ["a", "b c"], keep=1),
    "append": lambda rt, n: rt.append(n, " more"),
    "append_ids": lambda rt, n: rt.append_ids(n, [5, 6]),
    "set_value": lambda rt, n: rt.set_value(n, 0.5),
    "release": lambda rt, n: rt.release(n),
    "path_token_ids": lambda rt, n: rt.path_token_ids(n),
    "next_token_logprobs": lambda rt, n: rt.next_token_logprobs(n),
    "residency": lambda rt, n: rt.residency(n),
    "tree_seed": lambda rt, n: rt.tree_seed(n),
}
#: calls that only read, allowed on a released node of the same runtime (a released node stays readable)
READS = {"path_token_ids", "residency", "tree_seed"}


def test_release_of_a_foreign_node_changes_neither_runtime(tiny):
    """Issue 21: ``rt.release(node_of_another_runtime)`` wiped the caller's tree (3 live nodes,
    30 resident tokens -> 0 and 0) and marked the other's nodes released while they kept their KV."""
    a, b = Runtime(tiny), Runtime(tiny)
    three_nodes(a)
    b_root, b_kids = three_nodes(b)
    assert (len(a.nodes), a.store.resident_tokens) == (3, 30)
    before_a, before_b = snapshot(a), snapshot(b)
    with pytest.raises(NodeError, match="belongs to another Runtime"):
        a.release(b_root)
    assert snapshot(a) == before_a
    assert snapshot(b) == before_b
    assert not any(n.released for n in [b_root, *b_kids])
    b.release(b_kids[0])  # the owner can still release it
    assert b_kids[0].released and b.store.resident_tokens == 20 and a.store.resident_tokens == 30


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_call_refuses_a_foreign_node(tiny, call):
    """Node ids collide across runtimes (both have a node 0, 1, 2): each public call on the other's
    node raises and leaves both runtimes as they were."""
    a, b = Runtime(tiny), Runtime(tiny)
    a_root, _ = three_nodes(a)
    b_root, b_kids = three_nodes(b)
    assert a_root.id == b_root.id
    before_a, before_b = snapshot(a), snapshot(b)
    for foreign in (b_root, b_kids[1]):
        with pytest.raises(NodeError, match="another Runtime"):
            CALLS[call](a, foreign)
    assert snapshot(a) == before_a
    assert snapshot(b) == before_b


def test_set_value_and_residency_of_a_foreign_node_do_not_touch_the_callers_block(tiny):
    """Issue 21: ``set_value`` and ``residency`` acted on the caller's block with the same id."""
    a, b = Runtime(tiny), Runtime(tiny)
    a_root, a_kids = three_nodes(a)
    b.new_tree_ids([1, 2, 3])  # b's node 0 is 3 tokens, a's is 10
    b_root = b.nodes[0]
    with pytest.raises(NodeError):
        a.set_value(b_root, 0.9)
    assert a_root.value is None and b_root.value is None
    with pytest.raises(NodeError):
        a.residency(b_root)
    assert b.residency(b_root) == {"device": 3, "host": 0, "dropped": 0}
    assert a.residency(a_root) == {"device": 10, "host": 0, "dropped": 0}


def test_a_request_list_with_one_foreign_node_starts_nothing(tiny):
    a, b = Runtime(tiny), Runtime(tiny)
    a_root, _ = three_nodes(a)
    b_root, _ = three_nodes(b)
    before = snapshot(a)
    with pytest.raises(NodeError):
        a.expand_many([(a_root, 2), (b_root, 1)], SHORT)
    assert snapshot(a) == before and a_root.spawned == 2  # the legal request did not start either


def test_nodes_not_made_by_a_runtime_are_refused(tiny):
    rt = Runtime(tiny)
    root, _ = three_nodes(rt)
    handmade = Node(id=root.id, parent=None, token_ids=list(root.token_ids), text=root.text, kind="prompt", start_pos=0)
    before = snapshot(rt)
    with pytest.raises(NodeError, match="no Runtime"):
        rt.release(handmade)
    with pytest.raises(NodeError, match="expected a Node"):
        rt.expand(root.id, 1, SHORT)
    with pytest.raises(NodeError, match="expected a Node"):
        rt.set_value(None, 0.5)
    with pytest.raises(ValueError, match=r"\(node, n\) pair"):
        rt.expand_many([root], SHORT)
    with pytest.raises(ValueError, match="positive integer"):
        rt.expand(root, True, SHORT)
    assert snapshot(rt) == before


def test_a_deep_copy_and_its_original_refuse_each_others_nodes(tiny):
    """A fork (benchmarks copy a prefilled runtime) has nodes of its own: same ids, new owner."""
    rt = Runtime(tiny)
    root, _ = three_nodes(rt)
    clone = copy.deepcopy(rt, {id(tiny.model): tiny.model, id(tiny.tokenizer): tiny.tokenizer})
    twin = clone.nodes[root.id]
    assert twin is not root and twin.owner is clone.owner and clone.owner is not rt.owner
    before = snapshot(rt)
    with pytest.raises(NodeError):
        clone.release(root)
    with pytest.raises(NodeError):
        rt.expand(twin, 1, SHORT)
    assert snapshot(rt) == before
    assert clone.expand(twin, 1, SHORT)[0].owner is clone.owner


# ---- released nodes -----------------------------------------------------------------------------
@pytest.mark.parametrize("call", sorted(CALLS))
def test_released_node(tiny, call):
    """A released node stays readable (its tokens, its residency: nothing resident) and is refused
    for anything that needs its KV or changes the tree (releasing it again included)."""
    rt = Runtime(tiny)
    root, kids = three_nodes(rt)
    rt.release(kids[0])
    before = snapshot(rt)
    if call in READS:
        CALLS[call](rt, kids[0])
    else:
        with pytest.raises(NodeError, match="was released"):
            CALLS[call](rt, kids[0])
    assert snapshot(rt) == before
    assert rt.metrics.nodes_released == 1
    assert rt.residency(kids[0]) == {"device": 0, "host": 0, "dropped": 10}
    assert rt.path_token_ids(kids[0])[:10] == list(range(1, 11))


# ---- token ids ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([1, 2, 10**6], r"token id 1000000 at index 2 is outside the vocabulary: valid ids are 0\.\.49151"),
        ([-1], r"token id -1 at index 0 is outside the vocabulary: valid ids are 0\.\.49151"),
        ([49152], r"token id 49152 at index 0 is outside"),
        ([1, 2.5], r"token id 2\.5 at index 1 is not an integer"),
        ("1 2 3", "got the string"),
        (7, "must be a sequence of integers"),
        (torch.tensor([1.0, 2.0]), r"token id 1\.0 at index 0 is not an integer"),
    ],
)
def test_bad_token_ids_are_refused_before_any_work(tiny, ids, match):
    rt = Runtime(tiny, budget_tokens=40)
    root = rt.new_tree_ids(list(range(1, 15)))
    before = snapshot(rt)
    with pytest.raises(TokenIdError, match=match):
        rt.new_tree_ids(ids)
    with pytest.raises(TokenIdError, match=match.replace("token ids", "")):
        rt.append_ids(root, ids)
    assert snapshot(rt) == before
    assert rt.metrics.forward_calls == 1 and rt.metrics.nodes_created == 1  # only the root's prefill


def test_token_ids_as_tensors_and_numpy_style_ints_are_taken(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree_ids(torch.tensor([1, 2, 3]))
    kid = rt.append_ids(root, [torch.tensor(4), 5])
    assert rt.path_token_ids(kid) == [1, 2, 3, 4, 5]


def test_token_id_error_is_a_user_error():
    assert issubclass(TokenIdError, ArborError) and issubclass(TokenIdError, ValueError)
    assert issubclass(NodeError, ArborError) and issubclass(NodeError, ValueError)


def test_thirty_bad_appends_leak_nothing_and_the_next_expand_fits(tiny):
    """Issue 21: 30 failed ``append_ids(root, [10**6])`` took a 40-slot pool from 14 to 38 used
    with one live node; the next legal expand failed with KVBudgetExceeded."""
    rt = Runtime(tiny, budget_tokens=40)
    root = rt.new_tree_ids(list(range(1, 15)))
    assert rt.store.pool.used == 14
    for _ in range(30):
        with pytest.raises(TokenIdError, match="1000000"):
            rt.append_ids(root, [10**6])
    assert rt.store.pool.used == 14 == held_by_live_nodes(rt) and list(rt.nodes) == [root.id]
    kid = rt.expand(root, 1, GREEDY)[0]
    assert kid.length == 10 and rt.store.pool.used == 24 == held_by_live_nodes(rt)


def test_bad_new_trees_under_arbor_leave_no_slot_behind(tiny):
    """Issue 21: under arbor, 5 failed ``new_tree_ids`` left 20 slots held by no node."""
    rt = Runtime(tiny, policy="arbor", budget_tokens=40)
    for _ in range(5):
        with pytest.raises(TokenIdError):
            rt.new_tree_ids([1, 2, 3, 10**6])
    assert rt.store.pool.used == 0 and not rt.nodes and not rt.all_nodes


def test_choose_checks_its_choices_token_ids(tiny, monkeypatch):
    """Choices are text, but a tokenizer can yield ids the model does not have (added tokens)."""
    rt = Runtime(tiny)
    root = rt.new_tree_ids([1, 2, 3])
    monkeypatch.setattr(rt, "vocab_size", 100)  # the tokenizer's ids for "zebra" are >= 100
    before = snapshot(rt)
    with pytest.raises(TokenIdError, match=r"choose: choice 'zebra'.*valid ids are 0\.\.99"):
        rt.choose(root, ["zebra", "a"], keep=1)
    assert snapshot(rt) == before


# ---- a forward that fails -------------------------------------------------------------------
class DeviceLost(RuntimeError):
    pass


def failing_forward(rt: Runtime, monkeypatch, after: int = 0) -> None:
    """Make the backend's forward raise (a device error) from its ``after``-th call on."""
    real, calls = rt.backend.forward, [0]

    def forward(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise DeviceLost("device lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(rt.backend, "forward", forward)


OPS = {
    "new_tree_ids": lambda rt, node: rt.new_tree_ids([7, 8, 9, 10]),
    "append_ids": lambda rt, node: rt.append_ids(node, [7, 8, 9, 10, 11]),
    "expand": lambda rt, node: rt.expand(node, 2, SHORT),
    "choose": lambda rt, node: rt.choose(node, ["a b", "c d e"], keep=1),
}


@pytest.mark.parametrize("policy", ["full", "arbor"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_failed_forwards_give_back_their_slots(tiny, monkeypatch, policy, op):
    """After N failing calls the pool holds exactly what the live nodes hold, and the next legal
    call (the forward works again) fits as it would have."""
    rt = Runtime(tiny, policy=policy, budget_tokens=40)
    root = rt.new_tree_ids(list(range(1, 15)))
    kid = rt.expand(root, 1, GREEDY)[0]
    before = snapshot(rt)
    failing_forward(rt, monkeypatch)
    for _ in range(6):
        with pytest.raises(DeviceLost):
            OPS[op](rt, kid)
    assert rt.store.pool.used == held_by_live_nodes(rt) == before["pool_used"]
    assert sorted(rt.nodes) == before["live"] and sorted(rt.all_nodes) == before["all"]
    assert not rt.engine.busy and not rt.engine.running and not rt.engine.waiting
    monkeypatch.undo()
    made = OPS[op](rt, kid)
    assert made is not None and rt.store.pool.used == held_by_live_nodes(rt)


def test_a_chunked_prefill_that_fails_midway_gives_back_every_chunk(tiny, monkeypatch):
    """A prompt larger than the budget (h2o prefills it in chunks, evicting between them): the
    first chunk is stored, the second chunk's forward fails; nothing of the prompt stays."""
    rt = Runtime(tiny, policy="h2o", budget_tokens=32)
    keep = rt.new_tree_ids([1, 2, 3, 4])
    failing_forward(rt, monkeypatch, after=1)
    with pytest.raises(DeviceLost):
        rt.new_tree_ids(list(range(10, 60)))  # 50 tokens, chunks of 8
    assert rt.store.pool.used == held_by_live_nodes(rt) and list(rt.nodes) == [keep.id]
    monkeypatch.undo()
    big = rt.new_tree_ids(list(range(10, 60)))
    assert rt.store.pool.used == held_by_live_nodes(rt) <= 32 and big.length == 50


def test_a_failed_first_sample_frees_the_rows_slots(tiny, monkeypatch):
    """Rows get their first slots at admission and sample their first token from the stored
    logits: a failure there fails the expansion and frees every row's slots."""
    import arbor_runtime.engine.executor as executor

    rt = Runtime(tiny, budget_tokens=40)
    root = rt.new_tree_ids(list(range(1, 15)))

    def boom(*args, **kwargs):
        raise DeviceLost("sampling failed")

    monkeypatch.setattr(executor, "sample_into", boom)
    for _ in range(5):
        with pytest.raises(DeviceLost):
            rt.expand(root, 3, GREEDY)
    assert rt.store.pool.used == 14 == held_by_live_nodes(rt)
    monkeypatch.undo()
    assert len(rt.expand(root, 2, GREEDY)) == 2


def test_a_failure_while_a_child_is_stored_takes_the_child_and_its_slots(tiny, monkeypatch):
    """A finished row becomes a block, then the policy hears of it (node end); when that fails the
    half-made child goes too: no live node nobody was handed, no slot held by no node."""
    rt = Runtime(tiny, budget_tokens=40)
    root = rt.new_tree_ids(list(range(1, 15)))
    real, calls = rt.memory.node_end, [0]

    def node_end(node):
        calls[0] += 1
        if calls[0] == 2:  # the second child
            raise DeviceLost("plan failed")
        real(node)

    monkeypatch.setattr(rt.memory, "node_end", node_end)
    with pytest.raises(DeviceLost):
        rt.expand(root, 2, GREEDY)
    assert list(rt.nodes) == [root.id] and rt.store.pool.used == 14 == held_by_live_nodes(rt)
    assert root.children == []


def test_a_failed_expansion_takes_its_finished_children_as_a_failed_prefill_does(tiny, monkeypatch):
    """One request's row finishes, the other's forward then fails: the finished child goes from the
    store, the live and all-node tables, the memory manager's active set and the node counts of the
    runtime and of the caller's account, as a node whose prefill failed does."""
    rt = Runtime(tiny, policy="h2o", budget_tokens=40)
    root = rt.new_tree_ids(list(range(1, 15)))
    quick, slow = SamplingParams(max_new_tokens=2, **FIXED), SamplingParams(max_new_tokens=10, **FIXED)
    counts = (rt.metrics.nodes_created, rt.metrics.nodes_released)
    finished: list[Node] = []
    real_child = rt.prefiller.child_from_row

    def child_from_row(row):
        finished.append(real_child(row))
        return finished[-1]

    monkeypatch.setattr(rt.prefiller, "child_from_row", child_from_row)
    failing_forward(rt, monkeypatch, after=4)  # the quick row is done by then, the slow one is not
    with rt.account() as account, pytest.raises(DeviceLost):
        rt.expand_many([(root, 1), (root, 1)], [quick, slow])
    assert len(finished) == 1 and finished[0].released
    assert list(rt.nodes) == list(rt.all_nodes) == [root.id] and root.children == []
    assert (rt.metrics.nodes_created, rt.metrics.nodes_released) == counts
    assert (account.metrics.nodes_created, account.metrics.nodes_released) == (0, 0)
    assert rt.memory.active <= set(rt.store.block_ids())
    assert rt.store.pool.used == 14 == held_by_live_nodes(rt)
    monkeypatch.undo()
    assert [k.length for k in rt.expand_many([(root, 1), (root, 1)], [quick, slow])[0]] == [2]


# ---- sampling parameters and values -------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"temperature": -1.0},
        {"temperature": "0.7"},
        {"top_p": math.nan},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 2.0},
        {"top_p": math.inf},
        {"max_new_tokens": 0},
        {"max_new_tokens": 2.5},
        {"top_k": -1},
        {"top_k": 1.5},
        {"seed": "abc"},
    ],
)
def test_sampling_params_refuse_bad_values(kwargs):
    """Issue 21: ``SamplingParams(temperature=nan)`` was accepted and every token became id 49151."""
    ((name, value),) = kwargs.items()
    with pytest.raises(ValueError, match=f"{name}={value!r}"):
        SamplingParams(**kwargs)


def test_sampling_params_keep_the_valid_edges():
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=2, top_p=1, top_k=0, seed=3).top_p == 1
    assert SamplingParams(top_p=1e-9).top_p == 1e-9


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None, "0.5", [0.5]])
def test_set_value_refuses_what_is_not_a_finite_number(tiny, value):
    rt = Runtime(tiny, policy="arbor", budget_tokens=40)
    root, kids = three_nodes(rt)
    rt.set_value(kids[0], 0.25)
    before = snapshot(rt)
    with pytest.raises(ValueError, match="must be a finite number"):
        rt.set_value(kids[0], value)
    assert kids[0].value == 0.25 and snapshot(rt) == before


def test_set_value_takes_numbers_of_any_kind(tiny):
    rt = Runtime(tiny)
    root = rt.new_tree_ids([1, 2, 3])
    for value, expected in [(1, 1.0), (torch.tensor(0.5), 0.5), (True, 1.0), (-3.5, -3.5)]:
        rt.set_value(root, value)
        assert root.value == expected and type(root.value) is float


def test_arbor_evicts_after_a_refused_nan_value(tiny):
    """Issue 21: ``rt.set_value(node, nan)`` was accepted and the next arbor eviction crashed in
    policies/allocation.py ("cannot convert float NaN to integer"). Now the value is refused and
    the search goes on evicting under its budget."""
    rt = Runtime(tiny, policy="arbor", budget_tokens=40)
    four = SamplingParams(max_new_tokens=4, temperature=0.0, stop_at_eos=False)
    root = rt.new_tree_ids([1, 2, 3, 4])
    kids = rt.expand(root, 2, four)
    with pytest.raises(ValueError, match="value=nan"):
        rt.set_value(kids[0], float("nan"))
    rt.set_value(kids[1], 0.5)
    node = kids[1]
    for _ in range(4):  # 4 + 2*4 + 4*2*4 = 44 tokens of blocks for 40 slots: arbor must evict
        low, high = rt.expand(node, 2, four)
        rt.set_value(low, 0.2)
        rt.set_value(high, 0.9)
        node = high
    assert rt.store.counters.evicted_tokens > 0
    assert rt.store.pool.used == held_by_live_nodes(rt) <= 40


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_water_fill_counts_a_non_finite_weight_as_the_lowest(bad):
    """A non-finite weight reaching the allocation (a value assigned to ``node.value`` directly)
    is the lowest weight, not a crash ("cannot convert float NaN to integer")."""
    sizes, floors, capacity = [10, 10, 10], [1, 1, 1], 15
    assert water_fill(sizes, floors, [0.9, bad, 0.4], capacity) == water_fill(sizes, floors, [0.9, 0.0, 0.4], capacity)
    alloc = water_fill(sizes, floors, [0.9, bad, 0.4], capacity)
    assert sum(alloc) <= capacity and alloc[1] == 1 and alloc[0] > alloc[2] > 1
    assert fit_floors([4, 4, 4], [0.9, bad, 0.4], 8) == [4, 0, 4]  # its floor goes first


def test_arbor_evicts_around_a_nan_value_assigned_directly(tiny):
    """``node.value = nan`` bypasses ``set_value``; arbor's next eviction ranks that block lowest."""
    rt = Runtime(tiny, policy="arbor", budget_tokens=40)
    four = SamplingParams(max_new_tokens=4, temperature=0.0, stop_at_eos=False)
    root = rt.new_tree_ids([1, 2, 3, 4])
    nan_kid, node = rt.expand(root, 2, four)
    nan_kid.value = math.nan
    for _ in range(4):  # 44 tokens of blocks for 40 slots: arbor must evict
        _, node = rt.expand(node, 2, four)
    assert rt.store.counters.evicted_tokens > 0 and rt.residency(nan_kid)["device"] < nan_kid.length
    assert rt.store.pool.used == held_by_live_nodes(rt) <= 40


def test_node_and_token_id_errors_are_exported():
    import arbor_runtime

    assert {"NodeError", "TokenIdError"} <= set(arbor_runtime.__all__)
    assert arbor_runtime.NodeError is NodeError and arbor_runtime.TokenIdError is TokenIdError


def test_arbor_refuses_a_negative_host_budget():
    from arbor_runtime.policies import ArborPolicy

    with pytest.raises(ValueError, match="host_budget_tokens=-1 must be an integer >= 0"):
        ArborPolicy(budget_tokens=100, host_budget_tokens=-1)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_msve_features_count_a_non_finite_value_as_zero(value):
    from arbor_runtime.policies.msve import unit_value

    assert unit_value(value) == 0.0


# ---- issue 63: values the API took and failed on later, or dropped without a word -----------------
@pytest.mark.parametrize("seed", ["x", 1.5, True, None])
def test_a_runtime_seed_that_is_not_an_integer_is_refused_when_built(tiny, seed):
    """``Runtime(lm, seed='x')`` was accepted, then an OverflowError at the first expand."""
    with pytest.raises(ValueError, match=r"Runtime seed=.* must be an integer"):
        Runtime(tiny, seed=seed)


@pytest.mark.parametrize("seed", [1.5, "3", False])
def test_a_tree_seed_that_is_not_an_integer_is_refused_before_any_work(tiny, seed):
    """``new_tree(seed=1.5)`` was truncated to 1 without a word."""
    rt = Runtime(tiny)
    with pytest.raises(ValueError, match=r"new_tree seed=.* must be an integer"):
        rt.new_tree("1 2 3 4", seed=seed)
    assert rt.nodes == {} and rt.store.pool.used == 0


def test_a_built_policy_with_another_budget_is_refused(tiny):
    """``Runtime(lm, policy=ArborPolicy(), budget_tokens=500)`` dropped the 500 without a word."""
    from arbor_runtime.policies import ArborPolicy

    with pytest.raises(
        ValueError, match=r"budget_tokens=500 conflicts with the built ArborPolicy's budget_tokens=None"
    ):
        Runtime(tiny, policy=ArborPolicy(), budget_tokens=500)
    assert Runtime(tiny, policy=ArborPolicy(budget_tokens=500), budget_tokens=500).budget_tokens == 500  # the same
    assert Runtime(tiny, policy=ArborPolicy(budget_tokens=500)).budget_tokens == 500


def test_a_budget_no_machine_holds_is_one_budget_error(tiny):
    """``Runtime(lm, policy='arbor', budget_tokens=10**12)`` was the allocator's own RuntimeError."""
    with pytest.raises(ArborError, match=r"budget_tokens=1000000000000 needs .* of KV .* valid: at most"):
        Runtime(tiny, policy="arbor", budget_tokens=10**12)


@pytest.mark.parametrize(("call", "where"), [("append", "append: text"), ("new_tree", "new_tree: prompt")])
@pytest.mark.parametrize("text", [123, None, b"bytes", ["a"]])
def test_text_that_is_not_a_string_is_named_as_ours(tiny, call, where, text):
    """``rt.append(node, 123)`` and ``new_tree(None)`` were answered by the tokenizer's message (batches, pairs)."""
    rt = Runtime(tiny)
    root = rt.new_tree("1 2 3 4")
    before = snapshot(rt)
    with pytest.raises(ValueError, match=rf"^{where} must be a string, got"):
        rt.append(root, text) if call == "append" else rt.new_tree(text)
    assert snapshot(rt) == before


@pytest.mark.parametrize("source", [{"regex": "("}, {"regex": "[0-9"}, {"grammar": "start: (("}])
def test_a_regex_or_grammar_that_does_not_compile_is_refused_when_built(source):
    """``SamplingParams(regex="(")`` was accepted when built and refused at the expand (the docs say values
    are checked when built)."""
    kind = next(iter(source))
    with pytest.raises(ValueError, match=rf"SamplingParams {kind}=.* does not compile: "):
        SamplingParams(**source)


def test_a_release_racing_an_expansion_fails_that_expansion_with_node_error(tiny, monkeypatch):
    """Thread A expands below the root; at its first decode step thread B releases the root. A's expansion
    fails with NodeError (not a raw KeyError from the store), B's release succeeds, and a third tree's
    expansion in the same runtime is untouched."""
    import threading

    rt = Runtime(tiny)
    root, other = rt.new_tree("1 2 3 4 5 6"), rt.new_tree("7 8 9 10")
    forward, released, out = rt.backend.forward, threading.Event(), {}

    def release_in_another_thread():
        rt.release(root)
        released.set()

    def first_step_races(*args, **kwargs):
        monkeypatch.setattr(rt.backend, "forward", forward)  # once
        threading.Thread(target=release_in_another_thread).start()
        while not rt.engine._pending:  # B's release is queued: the driver takes it next cycle
            threading.Event().wait(0.001)
        return forward(*args, **kwargs)

    monkeypatch.setattr(rt.backend, "forward", first_step_races)
    with pytest.raises(NodeError, match=r"node 0 was released \(by another thread\) while an expansion below it"):
        rt.expand(root, 2, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0, stop_at_eos=False))
    assert released.wait(10) and root.released
    out["kids"] = rt.expand(other, 2, SHORT)  # the runtime goes on
    assert len(out["kids"]) == 2 and rt.store.pool.used == held_by_live_nodes(rt)
