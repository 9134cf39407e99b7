"""Arbor's parts, each switchable (issue 65): every switch changes what it should and nothing else breaks.

MSVE (``policy.msve``: all, off, or one signal alone), topology (``policy.topology``: distance decay),
token extraction (``policy.extract``), rehydration (``policy.host_tier``) and the pins below the floor
(``policy.pins``). Plans are checked on plain bookkeeping; rehydration and extraction also on the tiny
model under a budget, where the budget must hold whatever is switched off.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_below_floor import SHAPE, chain
from test_below_floor import search as below_floor_search
from test_cli import compose_cfg
from test_policies import BUDGET, run_ops

from arbor_cli.budget import PolicyFactory
from arbor_runtime import Runtime
from arbor_runtime.events import replay_resident
from arbor_runtime.kv import BlockKV, KVStore
from arbor_runtime.planner import MemoryConfig, MemoryPlanner
from arbor_runtime.policies import ArborPolicy
from arbor_runtime.policies.allocation import whole_blocks
from arbor_runtime.policies.base import BlockView, MemoryView
from arbor_runtime.policies.msve import DEFAULT_CALIBRATION, SIGNALS, MSVEWeights, block_values
from arbor_runtime.tree import GENERATED, PROMPT, Node

# ---- plans on plain bookkeeping --------------------------------------------------------------------------
#: (id, parent id, length, attention per token): the active path root -> x; a and b under the root, c under a
BLOCKS = [(0, None, 10, 1.0), (1, 0, 5, 1.0), (2, 0, 20, 3.0), (3, 0, 20, 1.0), (4, 2, 20, 3.0)]
ACTIVE = frozenset({0, 1})


def tree_view(target: int, values: dict[int, float] | None = None) -> MemoryView:
    """:data:`BLOCKS`, stored whole, each token seen by one query; ``values``: search values by block id."""
    store = KVStore(SHAPE, capacity=200)
    nodes: dict[int, Node] = {}
    views = []
    for i, parent, n, attention in BLOCKS:
        up = nodes.get(parent)
        start = 0 if up is None else up.start_pos + up.length
        node = Node(id=i, parent=up, token_ids=list(range(n)), text="", kind=PROMPT if up is None else GENERATED,
                    start_pos=start)  # fmt: skip
        if up is not None:
            up.children.append(node)
        node.value = (values or {}).get(i)
        nodes[i] = node
        blk = BlockKV.from_extents(store.pool.alloc(n), start, None)
        blk.attention, blk.observers = torch.full((n,), attention), 1.0
        store.put(i, blk)
        views.append(BlockView(node, blk, i in ACTIVE))
    return MemoryView(views, ACTIVE, 200, target=target)


def kept(plan, block_id: int) -> int:
    """Tokens a plan keeps of a block (all of them when the plan leaves it alone)."""
    return len(plan.keep[block_id]) if block_id in plan.keep else dict((i, n) for i, _, n, _ in BLOCKS)[block_id]


def test_msve_modes_read_the_signals_they_name():
    shipped = ArborPolicy().weights
    assert ArborPolicy(msve="all").weights == shipped
    off = ArborPolicy(msve="off").weights
    assert all(getattr(off, s) == 0.0 for s in SIGNALS) and off.bias == shipped.bias
    single = json.loads(DEFAULT_CALIBRATION.read_text()).get("single", {})  # each signal's own fit, when fitted
    for signal in SIGNALS:
        alone = ArborPolicy(msve=signal).weights
        want = single[signal][signal] if signal in single else getattr(shipped, signal)
        assert getattr(alone, signal) == want and (signal not in single or alone.bias == single[signal]["bias"])
        assert all(getattr(alone, s) == 0.0 for s in SIGNALS if s != signal)
    with pytest.raises(ValueError, match="MSVE signal 'x'; valid: search, uncertainty, attention, depth"):
        MSVEWeights().only("x")


def test_msve_off_values_every_block_the_same():
    view = tree_view(40, values={2: 1.0, 3: 0.0})
    assert len(set(block_values(view.blocks, ArborPolicy(msve="off").weights, 32000).values())) == 1
    assert len(set(block_values(view.blocks, ArborPolicy().weights, 32000).values())) > 1


def test_without_msve_and_topology_equal_blocks_keep_equal_shares():
    plan = ArborPolicy(msve="off", topology=False).plan(tree_view(15 + 30))
    assert kept(plan, 2) == kept(plan, 3) == kept(plan, 4) == 10


def test_topology_decays_retention_with_distance_from_the_active_path():
    plan = ArborPolicy(msve="off").plan(tree_view(15 + 30))  # a and b one edge away, c two
    assert kept(plan, 2) == kept(plan, 3) > kept(plan, 4)


def test_a_single_signal_ignores_the_others(tmp_path):
    """msve=attention: the search values set by a verifier change nothing; the attended blocks keep more.
    msve=search (under a calibration that weighs it): the search value moves the share."""
    plans = [ArborPolicy(msve="attention", topology=False).plan(tree_view(45, v)) for v in ({2: 0.0}, {2: 1.0})]
    assert plans[0].keep.keys() == plans[1].keep.keys()
    assert all(torch.equal(plans[0].keep[i], plans[1].keep[i]) for i in plans[0].keep)
    assert kept(plans[0], 2) == kept(plans[0], 4) > kept(plans[0], 3)
    calibration = tmp_path / "msve.json"
    calibration.write_text(json.dumps({"weights": {"bias": 0.0, "search": 3.0, "attention": 2.0}}))
    search = [
        ArborPolicy(msve="search", topology=False, calibration=str(calibration)).plan(tree_view(45, v))
        for v in ({2: 0.0}, {2: 1.0})
    ]
    assert kept(search[0], 2) != kept(search[1], 2)  # the signal it reads moves it


def test_without_extraction_whole_blocks_stay_or_leave_by_weight():
    plan = ArborPolicy(msve="attention", topology=False, extract=False).plan(tree_view(15 + 45))
    assert sorted(plan.keep) == [3]  # 60 tokens of room: a and c (attended) whole, b out
    assert plan.keep[3].numel() == 0
    assert whole_blocks([20, 20, 20], [0.2, 0.9, 0.5], 45) == [0, 20, 20]
    assert whole_blocks([30, 10], [0.9, 0.1], 25) == [0, 10]  # the best does not fit: the next that does
    assert whole_blocks([5, 5], [float("nan"), 0.5], 5) == [0, 5]


@pytest.mark.parametrize(
    ("pins", "want"),
    [
        # room 100 - 10 = 90 (see test_below_floor): the frontier (block 3) always, the rest as named
        ([], {3: list(range(20))}),
        (["sinks"], {0: [0, 1, 2, 3], 3: list(range(20))}),
        (["question"], {0: [*range(10), *range(50, 60)], 3: list(range(20))}),
        (["parent"], {3: list(range(20)), 2: list(range(15))}),
        (["sinks", "question", "parent"], {0: [*range(10), *range(50, 60)], 3: list(range(20)), 2: list(range(15))}),
    ],
)
def test_the_planner_pins_only_what_the_policy_names(pins, want):
    store = KVStore(SHAPE, capacity=200)
    nodes = chain(store, [60, 30, 15, 20], examples=(10, 50))
    planner = MemoryPlanner(store, ArborPolicy(pins=pins), MemoryConfig(budget_tokens=100))
    got = planner.pinned([nodes[-1]], need=10)
    assert {b: idx.tolist() for b, idx in got.items()} == want


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"msve": "value"}, "arbor msve='value'; valid: all, off, search, uncertainty, attention, depth"),
        ({"topology": "no"}, "arbor topology='no' must be true or false"),
        ({"extract": 1}, "arbor extract=1 must be true or false"),
        ({"pins": ["frontier"]}, "'frontier' is not a pin; valid: sinks, question, parent"),
        ({"pins": "sinks"}, "arbor pins='sinks' must be a list of: sinks, question, parent"),
        ({"pins": ["parent", "parent"]}, "names a pin twice"),
        ({"host_tier": False, "host_budget_tokens": 64}, "host_budget_tokens=64 caps a host tier that host_tier=false"),
    ],
)
def test_misused_switches_are_one_line_naming_the_value(args, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        ArborPolicy(**args)


def test_the_switches_reach_the_policy_from_the_command_line(data_dir):
    over = ("policy=arbor", "policy.msve=depth", "policy.topology=false", "policy.extract=false",
            "policy.host_tier=false", "policy.pins=[parent]", f"paths.data_dir={data_dir}")  # fmt: skip
    policy = PolicyFactory(compose_cfg(*over).policy, []).build(None)
    assert (policy.msve, policy.topology, policy.extract, policy.host_tier) == ("depth", False, False, False)
    assert policy.capabilities.pins == {"frontier", "parent"} and not policy.capabilities.offload
    default = PolicyFactory(compose_cfg("policy=arbor", f"paths.data_dir={data_dir}").policy, []).build(None)
    assert default.capabilities.pins == {"sinks", "frontier", "question", "parent"} and default.capabilities.offload


# ---- on the tiny model, under a budget -----------------------------------------------------------------------
SCRIPT = [("expand", random.Random(i).randrange(10_000), 1 + i % 2) for i in range(14)]


def budgeted(tiny, on_op=None, **switches) -> Runtime:
    """The script of test_policies' tight-budget test, run by arbor with ``switches``; the budget checked."""
    rt = Runtime(tiny, policy=ArborPolicy(budget_tokens=BUDGET, **switches), seed=3)
    run_ops(rt, SCRIPT, on_op=on_op)
    assert 0 < rt.metrics.peak_device_tokens <= BUDGET and rt.metrics.evicted_tokens > 0
    return rt


def test_without_rehydration_nothing_waits_on_the_host_and_paths_are_recomputed(tiny):
    default = budgeted(tiny)
    assert default.metrics.rehydrations > 0 and default.metrics.peak_host_tokens > 0
    rt = budgeted(tiny, host_tier=False)
    m = rt.metrics
    assert m.rehydrations == 0 and m.rehydrated_tokens == 0 and m.peak_host_tokens == 0
    assert m.recomputed_tokens > 0 and m.dropped_tokens == m.evicted_tokens


def partly_kept(rt: Runtime) -> list[int]:
    """Blocks of which some tokens are on the device and some are not."""
    return [i for i in rt.store.block_ids() if 0 < rt.store.get(i).kept_tokens < rt.store.get(i).length]


def test_without_extraction_every_block_is_whole_or_gone(tiny):
    partial = []

    def check(rt, *_):
        partial.extend(partly_kept(rt))

    rt = budgeted(tiny, on_op=check, extract=False)
    assert not partial
    with_extraction = []
    budgeted(tiny, on_op=lambda rt, *_: with_extraction.extend(partly_kept(rt)))
    assert with_extraction  # the default keeps parts of blocks: the check above can fail
    assert rt.metrics.evicted_tokens > 0


@pytest.mark.parametrize(
    "switches",
    [{"msve": "off"}, {"msve": "search"}, {"topology": False}, {"extract": False}, {"host_tier": False}, {"pins": []}],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_every_switch_keeps_the_budget_and_its_events_replay(tiny, switches):
    rt = budgeted(tiny, **switches)
    assert rt.store.resident_tokens == sum(rt.store.get(i).kept_tokens for i in rt.store.block_ids())
    replayed = replay_resident(rt.store.journal, rt.events)
    assert replayed == [(r.resident_tokens, r.host_tokens) for r in rt.events.records]


@pytest.mark.parametrize("pins", [[], ["sinks"], ["question"], ["parent"]], ids=str)
def test_below_the_floor_any_pins_keep_the_search_inside_the_budget(tiny, pins):
    rt = Runtime(tiny, policy=ArborPolicy(budget_tokens=96, pins=pins))
    nodes = below_floor_search(rt)
    assert nodes[0].length > 96 and rt.metrics.peak_device_tokens <= 96  # the prompt alone is over the budget
    assert len(nodes) == 9  # every operation ran: the root, 2 + 1 + 1 children, a forced block, 1 + 2 children
