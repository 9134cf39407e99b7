"""The tree-blind heavy-hitter policies on crafted attention records and on the runtime's own records:
h2o keeps the heavy hitters, snapkv keeps (pooled) what its window attends to."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import Runtime
from arbor_runtime.kv import BlockKV, Extent
from arbor_runtime.policies import H2OPolicy, SnapKVPolicy, build_policy
from arbor_runtime.policies.base import BlockView, MemoryView
from arbor_runtime.tree import PROMPT, Node

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def view_of(*records: torch.Tensor, target: int) -> MemoryView:
    """Blocks (a chain, oldest first) whose attention records are ``records``; all tokens on device."""
    blocks, parent, start = [], None, 0
    for i, record in enumerate(records):
        n = record.numel()
        node = Node(id=i, parent=parent, token_ids=[5] * n, text="", kind=PROMPT, start_pos=start)
        kv = BlockKV.from_extents([Extent(start, n)], start, None)
        kv.attention = record.float().clone()
        blocks.append(BlockView(node, kv, active=True))
        parent, start = node, start + n
    return MemoryView(blocks=blocks, active=frozenset(range(len(records))), budget=None, target=target)


def kept(plan, block_id: int, n: int) -> list[int]:
    return plan.keep[block_id].tolist() if block_id in plan.keep else list(range(n))


def test_h2o_keeps_the_heavy_hitters_of_a_crafted_attention_pattern():
    record = torch.full((100,), 0.1)
    heavy = [3, 17, 40, 41, 77]
    record[heavy] = torch.tensor([9.0, 7.0, 5.0, 8.0, 6.0])
    record[90:] = 0.0  # the recent tokens stay whatever they received
    plan = H2OPolicy(heavy_ratio=1, recent_ratio=1).plan(view_of(record, target=10))
    assert kept(plan, 0, 100) == [*heavy, *range(95, 100)]
    # across blocks: one flattened sequence, the recent window at its end
    second = torch.zeros(20)
    second[2] = 50.0
    plan = H2OPolicy(heavy_ratio=1, recent_ratio=1).plan(view_of(record, second, target=10))
    assert kept(plan, 0, 100) == [3, 17, 41, 77] and kept(plan, 1, 20) == [2, 15, 16, 17, 18, 19]


def test_h2o_keeps_the_top_of_the_runtime_record_after_a_real_prefill(tiny):
    ids = torch.randint(3, 5000, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    rt = Runtime(tiny, policy=H2OPolicy(heavy_ratio=3, recent_ratio=1))
    root = rt.new_tree_ids(ids)
    record = rt.store.get(root.id).attention.clone()
    rt.compress(80)
    recent = list(range(280, 300))
    heavy = torch.topk(record[:280], 60).indices
    assert rt.store.get(root.id).kept.tolist() == sorted([*heavy.tolist(), *recent])


def test_snapkv_pools_neighbours_of_a_strongly_attended_token_and_keeps_its_window():
    record = torch.full((60,), 0.01)
    record[20] = 10.0  # one spike; kernel 5 spreads it over 18..22
    record[50:] = 100.0  # the window's own tokens: protected, and zeroed before pooling
    plan = SnapKVPolicy(window_size=10, kernel_size=5).plan(view_of(record, target=15))
    assert kept(plan, 0, 60) == [18, 19, 20, 21, 22, *range(50, 60)]
    plan = SnapKVPolicy(window_size=10, kernel_size=5, pooling="max").plan(view_of(record, target=15))
    assert kept(plan, 0, 60) == [18, 19, 20, 21, 22, *range(50, 60)]
    unpooled = SnapKVPolicy(window_size=10, kernel_size=1).plan(view_of(record, target=15))
    assert 20 in kept(unpooled, 0, 60) and 18 not in kept(unpooled, 0, 60)
    # pooling would lift tokens 48, 49 next to the window (to ~40) if the window's scores were not zeroed
    plan = SnapKVPolicy(window_size=10, kernel_size=5).plan(view_of(record, target=12))
    extra = kept(plan, 0, 60)[:2]
    assert kept(plan, 0, 60)[2:] == list(range(50, 60)) and all(18 <= i <= 22 for i in extra)


def test_snapkv_with_a_budget_below_its_window_keeps_the_newest_tokens():
    plan = SnapKVPolicy(window_size=10).plan(view_of(torch.rand(40), target=6))
    assert kept(plan, 0, 40) == list(range(34, 40))


def test_snapkv_configuration_errors():
    with pytest.raises(ValueError, match="window_size=0 must be a positive number of queries"):
        SnapKVPolicy(window_size=0)
    with pytest.raises(ValueError, match="kernel_size=4 must be a positive odd number of tokens"):
        SnapKVPolicy(kernel_size=4)
    with pytest.raises(ValueError, match="pooling='mean'; valid: avg, max"):
        build_policy("snapkv", pooling="mean")
