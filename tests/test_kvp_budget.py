"""KVP under a budget set from the start: the prompt is prefilled in chunks and compressed while it grows.

What ``arbor-solve policy=kvp policy.budget_tokens=B`` does. The scores of a block grown in chunks are
the scores of the same block prefilled whole (a token is scored by its block position, from its own
K/V); what the growing path adds is plans *between* chunks, which must not evict the tokens the next
chunk is about to read (the query window, see ``arbor_runtime/policies/kvp.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch
from rich.console import Console

from arbor_cli.build import compose_config
from arbor_cli.run import run
from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import KVPPolicy, build_policy

BUDGET = 32
#: a prompt of 67 tokens: more than the budget, so it is prefilled in chunks of BUDGET // 4
PROMPT = "Input: 4 4 6 8\nSteps:\n" + "".join(
    f"{a} + {b} = {a + b} (left: {a + b} {b})\n" for a, b in [(4, 4), (8, 6), (14, 8)]
)
QUESTION = "Input: 2 3 5 12\nSteps:\n12 - 5 = 7 (left: 2 3 7)\n"


def prompt_ids(rt: Runtime) -> list[int]:
    return list(rt.tokenizer(PROMPT, add_special_tokens=True)["input_ids"])


def whole_scores(tiny, ids: list[int]) -> torch.Tensor:
    """(G, T) head scores of the prompt prefilled whole, without a budget (nothing evicted)."""
    rt = Runtime(tiny, policy=KVPPolicy())
    root = rt.new_tree_ids(ids)
    return rt.policy.scores.head_scores(rt.memory.view(target=root.length))[0]


@dataclass(slots=True)
class RecordingKVP(KVPPolicy):
    """kvp that records, per plan, (pool size, target, keep mask over the flattened pool)."""

    plans: list = field(default_factory=list)

    def plan(self, view):
        out = KVPPolicy.plan(self, view)
        keep = [out.keep.get(b.node.id, b.kv.kept) if out else b.kv.kept for b in view.blocks]
        mask = torch.cat([torch.isin(b.kv.kept, k) for b, k in zip(view.blocks, keep, strict=True)])
        self.plans.append((int(mask.numel()), max(view.target, 0), mask))
        return out


def test_scores_of_a_prompt_grown_in_chunks_are_those_of_the_whole_prefill(tiny):
    rt = Runtime(tiny, policy=RecordingKVP(budget_tokens=BUDGET))
    ids = prompt_ids(rt)
    assert len(ids) > 2 * BUDGET
    plans = rt.policy.plans
    root = rt.new_tree_ids(ids)
    assert plans, "the prompt is longer than the budget: it must be compressed while it grows"
    assert rt.metrics.peak_device_tokens <= BUDGET
    cached, seen = rt.policy.scores._cache[root.id]
    assert cached.shape[1] == root.length and bool(seen.all())  # every token scored, by block position
    # tokens written before the first eviction have the K/V of the whole prefill: the same scores
    first = BUDGET - BUDGET % rt.planner.config.chunk_tokens
    whole = whole_scores(tiny, ids)
    assert torch.allclose(cached[:, :first], whole[:, :first], atol=1e-5)
    # every token's cached score is the scorer's on its stored K/V at its own position (no shift by
    # kept rank): checked on what is still on the device
    blk = rt.store.get(root.id)
    keys, values = rt.store.read(root.id)
    fresh = rt.policy.scores.scorer.score_layers(keys, values, blk.positions)
    assert torch.allclose(cached[:, blk.kept], fresh, atol=1e-5)


def test_chunks_without_eviction_score_exactly_like_the_whole_block(tiny):
    # a forced block prefilled in two chunks, the first fitting whole: no plan runs between its
    # chunks on the tokens they read, and every score equals the whole block's
    rt = Runtime(tiny, policy="kvp")
    ids = prompt_ids(rt)
    root = rt.new_tree_ids(ids[:30])
    child = rt.append_ids(root, ids[30:])
    grown = rt.policy.scores.head_scores(rt.memory.view(target=10**6))
    whole = whole_scores(tiny, ids)
    assert torch.allclose(torch.cat(grown, dim=1), whole, atol=1e-5)
    assert child.length == len(ids) - 30


@pytest.mark.parametrize("forced", [False, True])
def test_plans_between_chunks_keep_the_query_window(tiny, forced):
    """The plan that admits the next chunk keeps the newest tokens (what that chunk reads most): on
    main kvp ranked them by a recency-blind score and evicted the chunk just written."""
    rt = Runtime(tiny, policy=RecordingKVP(budget_tokens=BUDGET))
    ids = prompt_ids(rt)
    plans = rt.policy.plans
    root = rt.new_tree_ids(ids if not forced else ids[:20])
    if forced:  # a forced block larger than the room left (a task's question) grows in chunks too
        rt.append_ids(root, ids[20:])
    assert len(plans) >= 3
    for size, target, keep in plans:
        window = target // 2
        assert int(keep.sum()) <= target
        assert bool(keep[size - window :].all()), f"a plan to {target} of {size} tokens evicted the newest {window}"
    assert rt.metrics.peak_device_tokens <= BUDGET


def test_recent_ratio_zero_is_pure_ranking_and_bad_values_are_refused(tiny):
    rt = Runtime(tiny, policy=build_policy("kvp", recent_ratio=0.0), seed=0)
    root = rt.new_tree(PROMPT)
    view = rt.memory.view(target=10)
    scores = rt.policy.scores.token_scores(view)
    plan = rt.policy.plan(view)
    kept = torch.cat([plan.keep.get(b.node.id, b.kv.kept) for b in view.blocks])
    assert kept.numel() == 10 and set(kept.tolist()) == set(scores.topk(10).indices.tolist())
    assert root.length > 10
    for bad in (-0.1, 1.0, "half", True):
        with pytest.raises(ValueError, match="kvp recent_ratio="):
            build_policy("kvp", recent_ratio=bad)


def test_live_search_under_a_budget_from_the_start(tiny):
    rt = Runtime(tiny, policy="kvp", budget_tokens=BUDGET, seed=3)
    root = rt.new_tree(PROMPT)  # longer than the budget: prefilled in chunks
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    frontier = [root]
    for _ in range(3):  # a small BFS: every leaf expanded into two children
        frontier = [c for node in frontier[:2] for c in rt.expand(node, 2, params)]
        rt.append(frontier[0], QUESTION[:12])
    assert len(frontier) == 4 and all(n.length >= 1 for n in frontier)
    assert rt.metrics.evicted_tokens > 0 and rt.metrics.peak_device_tokens <= BUDGET


def test_cli_run_with_kvp_and_a_budget_from_the_start(data_dir, tmp_path):
    budget = 300  # the Game of 24 prompt is longer: it is prefilled in chunks and compressed while it grows
    cfg = compose_config(
        ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={tmp_path}", "task.end=902",
         "policy=kvp", f"policy.budget_tokens={budget}"]
    )  # fmt: skip
    assert run(cfg, console=Console(width=200)) == 0
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [900, 901]
    for row in rows:
        assert not row["oom"] and row["nodes_expanded"] >= 1
        assert 0 < row["peak_device_tokens"] <= budget and row["evicted_tokens"] > 0
