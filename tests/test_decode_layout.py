"""What a decode step reads is worked out once per layout, not every step (generation.DecodeLayout):
kept while the same rows run and no block's device layout changed, and then always what a fresh
computation gives, under policies that evict and rehydrate while rows decode."""

from __future__ import annotations

import pytest

from arbor_runtime import Runtime, SamplingParams, generation
from arbor_runtime.attention.tree import context_groups
from arbor_runtime.errors import KVBudgetExceeded

PROMPT = "Use numbers and basic arithmetic operations (+ - * /) to obtain 24. Input: 4 9 10 13"


def layout_of(contexts, groups) -> list:
    """Everything a batch reads from a layout, comparable with ==."""
    return [contexts] + [
        (g.block_id, None if g.rows is None else g.rows.tolist(), g.n_rows, g.start_pos,
         [(p.block_id, p.start, p.idx.tolist()) for p in g.pieces])
        for g in groups
    ]  # fmt: skip


def same_rows(a, b) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def watch_layouts(monkeypatch) -> dict[str, int]:
    """Check every decode step's kept layout against a fresh one; count steps that reused it and steps
    that worked it out again while the same rows ran (a layout change mid-expansion)."""
    counts = {"steps": 0, "reused": 0, "changed_same_rows": 0}
    of = generation.DecodeLayout.of

    def checked(self, store, rows):
        before = (self._value, self._rows)
        contexts, groups, reads = of(self, store, rows)
        fresh = [[n.id for n in row.owner.kv_path()] for row in rows]
        assert layout_of(contexts, groups) == layout_of(fresh, context_groups(store, fresh))
        assert [len(r) for r in reads] == [len(r) for r in generation.group_reads(groups, store.pool.device)]
        counts["steps"] += 1
        if self._value is before[0]:
            counts["reused"] += 1
        elif before[0] is not None and same_rows(before[1], rows):
            counts["changed_same_rows"] += 1
        return contexts, groups, reads

    monkeypatch.setattr(generation.DecodeLayout, "of", checked)
    return counts


@pytest.mark.parametrize("policy", ["h2o", "streaming", "arbor"])
def test_the_kept_layout_is_what_a_fresh_one_reads_while_blocks_are_evicted(tiny, policy, monkeypatch):
    counts = watch_layouts(monkeypatch)
    rt = Runtime(tiny, policy=policy, budget_tokens=60, seed=1)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    root = rt.new_tree(PROMPT)
    kids = rt.expand(root, 3, params)
    rt.expand_many([(kids[0], 2), (kids[2], 2)], params)
    rt.expand(kids[1], 2, params)
    assert counts["reused"] > 0  # kept across steps
    assert counts["steps"] > counts["reused"]
    assert rt.store.counters.evicted_tokens > 0  # the layout did change under the rows


def test_a_layout_changed_under_running_rows_is_worked_out_again(tiny, monkeypatch):
    """Evictions between two decode steps of the same rows: the next step reads the new layout."""
    counts = watch_layouts(monkeypatch)
    rt = Runtime(tiny, policy="h2o", budget_tokens=48, seed=1)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, stop_at_eos=False)
    try:
        rt.expand(rt.new_tree(PROMPT), 2, params)
    except KVBudgetExceeded:
        pytest.fail("the budget should hold two rows of 16 tokens beside an evicted prompt")
    assert counts["changed_same_rows"] > 0


def test_an_expansion_works_its_layout_out_once_when_nothing_moves(tiny, monkeypatch):
    calls = []
    monkeypatch.setattr(generation, "context_groups", lambda *a: calls.append(1) or context_groups(*a))
    rt = Runtime(tiny, policy="full", seed=1)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop_at_eos=False)
    rt.expand(rt.new_tree(PROMPT), 3, params)
    assert rt.metrics.decode_steps >= 11 and len(calls) == 1


def test_a_rows_slots_follow_its_extents():
    row = generation.Row(None, 0, 0, 0)
    row.add_slots([generation.Extent(10, 3)])
    assert row.slots(3) == [10, 11, 12]
    row.add_slots([generation.Extent(13, 2), generation.Extent(40, 2)])
    assert row.slots(6) == [10, 11, 12, 13, 14, 40]
    row.extents = [generation.Extent(5, 2)]  # reassigned (a block takes the used slots)
    assert row.slots(2) == [5, 6]
