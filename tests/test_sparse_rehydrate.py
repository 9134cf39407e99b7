"""On-demand rehydration under a sparse policy over arbor (``rehydrate=ranked``).

arbor alone makes the active path whole before each expansion; with ``rehydrate=ranked`` a row
starts with what is resident and, after each decode step, the evicted chunks its retrieval wanted
come back, the most wanted first, into room the policy can make, never past the budget.
"""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.errors import KVBudgetExceeded
from arbor_runtime.policies import LycheePolicy, QuestPolicy
from arbor_runtime.sparse.index import SelectConfig
from arbor_runtime.sparse.step import SparseStep

PROMPT = " ".join(f"Line {i} says the value is {i * 7 % 13}." for i in range(40)) + "\nAnswer:"
SAMPLED = SamplingParams(max_new_tokens=40, temperature=1.0)
SHORT = SamplingParams(max_new_tokens=8, temperature=1.0)
GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def policy(rehydrate: str, budget: int | None, cls=LycheePolicy, **knobs) -> LycheePolicy:
    args = dict(
        memory="arbor",
        budget_tokens=budget,
        token_budget=128,
        min_block_tokens=8,
        threshold=1.0,
        token_share=0.0,
        dense_below=0,
        dense_layers=0,
        index_reserve=0.03,
    )  # a fixed read budget (the defaults grow it with the context); the budgets below fit a 3% reserve
    if cls is LycheePolicy:  # the chunks these budgets were sized on (4-8 tokens, the defaults before issue 49)
        args |= {"min_chunk_tokens": 4, "max_chunk_tokens": 8}
    return cls(**(args | knobs), rehydrate=rehydrate)


def branch_away(rt: Runtime):
    """A prompt, children A and B; B's (short) children sampled, so A (inactive) is compressed to the host."""
    root = rt.new_tree(PROMPT, seed=3)
    a, b = rt.expand(root, 2, SAMPLED)
    rt.expand(b, 2, SHORT)
    return root, a


def host_at_first_decode(rt: Runtime, block_id: int) -> list[int]:
    """Wraps the backend so each decode forward records the block's host-tier tokens at its start."""
    seen, real = [], rt.backend.forward

    def forward(batch, input_ids, position_ids, logits_to_keep: int = 1):
        if batch.own_slots is not None:
            seen.append(rt.store.host_count(block_id))
        return real(batch, input_ids, position_ids, logits_to_keep)

    rt.backend.forward = forward
    return seen


def return_to_a(tiny, mode: str, budget: int, cls=LycheePolicy, **knobs):
    """Build the tree, return to A; (A's host tokens before, host tokens at each decode step,
    tokens rehydrated during the return, the answer, the runtime)."""
    rt = Runtime(tiny, policy=policy(mode, budget, cls, **knobs))
    _, a = branch_away(rt)
    hosted = rt.store.host_count(a.id)
    seen = host_at_first_decode(rt, a.id)
    before = rt.store.counters.rehydrated_tokens
    (answer,) = rt.expand(a, 1, GREEDY)
    return hosted, seen, rt.store.counters.rehydrated_tokens - before, answer, rt


@pytest.mark.parametrize("cls", [LycheePolicy, QuestPolicy])
def test_ranked_makes_the_path_whole_when_that_fits_as_whole_does(tiny, cls):
    hosted, seen, restored, answer, _ = return_to_a(tiny, "whole", 540, cls)
    assert hosted > 0  # A was compressed while B was searched
    assert seen[0] == 0 and restored == hosted  # made whole before the first step
    got = return_to_a(tiny, "ranked", 540, cls)
    assert got[:3] == (hosted, seen, restored) and got[3].token_ids == answer.token_ids


@pytest.mark.parametrize("cls", [LycheePolicy, QuestPolicy])
def test_ranked_starts_from_what_is_resident_and_brings_wanted_chunks_back(tiny, cls):
    """At a budget where A's path cannot be made whole for the row (all-or-nothing arbor: an OOM),
    ranked starts it anyway."""
    with pytest.raises(KVBudgetExceeded):
        return_to_a(tiny, "whole", 530, cls, memory_args={"degrade": False})
    hosted, seen, restored, answer, rt = return_to_a(tiny, "ranked", 530, cls)
    assert hosted > 0 and seen[0] == hosted  # the first pass reads what is resident
    assert seen[1] < hosted  # the wanted chunks came back and the first step ran again with them
    assert len(seen) == GREEDY.max_new_tokens + 1  # one forward per token, plus that probe
    assert 0 < restored <= hosted
    assert len(answer.token_ids) == GREEDY.max_new_tokens
    assert rt.metrics.peak_device_tokens <= rt.policy.kv_budget_tokens


def test_ranked_runs_a_search_at_a_budget_below_the_whole_active_path(tiny):
    """At a budget where making A's path whole cannot fit, whole fails (all-or-nothing arbor) and
    ranked decodes, never over the budget (the pool is the budget)."""
    for budget in range(600, 440, -10):
        rt = Runtime(tiny, policy=policy("whole", budget, memory_args={"degrade": False}))
        try:
            _, a = branch_away(rt)
        except KVBudgetExceeded:
            pytest.fail(f"budget {budget}: the tree before the return to A must fit")
        try:
            rt.expand(a, 1, GREEDY)
        except KVBudgetExceeded:
            break
    else:
        pytest.fail("no budget made whole rehydration fail")
    rt = Runtime(tiny, policy=policy("ranked", budget))
    _, a = branch_away(rt)
    (child,) = rt.expand(a, 1, GREEDY)
    assert len(child.token_ids) == GREEDY.max_new_tokens
    assert rt.store.pool.capacity == rt.policy.kv_budget_tokens
    assert rt.metrics.peak_device_tokens <= rt.policy.kv_budget_tokens


def test_wanted_chunks_come_most_demanded_first_and_stop_at_the_room(tiny):
    rt = Runtime(tiny, policy=policy("ranked", 520, token_budget=96))
    _, a = branch_away(rt)
    sparse, lists = rt.backend.sparse, []
    real = sparse.wanted

    def wanted():
        step = sparse.last_step
        out = real()
        if step is not None and out:
            demand = {}
            for plan in step.plans:
                chunk = torch.searchsorted(plan.index.starts, torch.stack([idx[0] for _, idx in out]), right=True) - 1
                for (block_id, _), c in zip(out, chunk.tolist(), strict=True):
                    if block_id == plan.block_id:
                        demand[len(demand)] = float(step.demand[plan.offset + c])
            lists.append([demand[i] for i in range(len(out))])
        return out

    sparse.wanted = wanted
    rt.expand(a, 1, GREEDY)
    assert lists, "no step wanted an evicted chunk"
    for demands in lists:
        assert all(d > 0 for d in demands)
        assert demands == sorted(demands, reverse=True)


def test_demand_counts_the_selections_a_hosted_chunk_would_enter():
    """One row, one KV head, budget 8 tokens: chunks of 4 tokens. Resident chunks 0-2 with bounds
    5, 3, 1; hosted chunks 3 and 4 (length 0) with bounds 4 and 2. Taken: 0 and 1 (8 tokens), so
    the lowest taken bound is 3: chunk 3 (4 >= 3) would have entered, chunk 4 (2 < 3) would not."""
    owner = type("Owner", (), {"select": SelectConfig(token_budget=8)})()
    step = SparseStep(owner, batch=None)
    step.hosted = torch.tensor([False, False, False, True, True])
    step.demand = torch.zeros(5)
    ids = torch.tensor([[[0, 3, 1, 4, 2]]])
    bounds = torch.tensor([[[5.0, 4.0, 3.0, 2.0, 1.0]]])
    size = torch.tensor([[[4, 0, 4, 0, 4]]])
    scores = torch.tensor([[[5.0, 3.0, 1.0]]])  # the resident ones, sorted, as _select sees them
    take = torch.tensor([[[True, True, False]]])
    step._count_demand([(ids, bounds)], scores, take, torch.tensor([[[4, 4, 4]]]))
    assert step.demand.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]
    # a selection that does not fill the budget wants every hosted chunk it retrieved
    step._count_demand([(ids, bounds)], scores[..., :1], take[..., :1], size[..., :1])
    assert step.demand.tolist() == [0.0, 0.0, 0.0, 2.0, 1.0]


def test_ranked_rehydration_errors_name_the_bad_value():
    with pytest.raises(ValueError, match=r"rehydrate='lazy'; valid: whole, ranked"):
        LycheePolicy(memory="arbor", rehydrate="lazy")
    with pytest.raises(ValueError, match=r"rehydrate=ranked needs .* not memory='h2o'"):
        LycheePolicy(memory="h2o", rehydrate="ranked")


def test_a_branch_with_every_token_on_the_host_is_ranked_and_comes_back(tiny):
    """A block with no token on the device is in no attention group; on demand its chunks still
    join the step (unread) so retrieval ranks them."""
    rt = Runtime(tiny, policy=policy("ranked", 560, index_reserve=0.1))
    _, a = branch_away(rt)
    rt.store.apply(a.id, torch.zeros(0, dtype=torch.long), offload=True)  # all of A to the host
    assert rt.store.get(a.id).kept_tokens == 0 and rt.store.host_count(a.id) == a.length
    sparse, first = rt.backend.sparse, []
    real = sparse.prepare

    def prepare(batch, positions):
        step = real(batch, positions)
        if not first:
            first.append(([p.block_id for p in step.plans], int(step.hosted.sum())))
        return step

    sparse.prepare = prepare
    before = rt.store.counters.rehydrated_tokens
    (child,) = rt.expand(a, 1, GREEDY)
    assert a.id in first[0][0] and first[0][1] > 0  # ranked at the first step
    assert rt.store.counters.rehydrated_tokens - before > 0
    assert len(child.token_ids) == GREEDY.max_new_tokens


def test_below_dense_below_a_ranked_step_reads_every_resident_chunk_and_still_ranks_the_host(tiny):
    """On demand a step is never dense (the host's chunks are ranked), but below ``dense_below`` its
    budget covers the resident context: every resident chunk is read, and wanted chunks still return."""
    hosted, _, restored, answer, rt = return_to_a(tiny, "ranked", 530, LycheePolicy, dense_below=10**6)
    stats = rt.backend.sparse.stats
    assert stats.steps > 0 and stats.dense_steps == 0 and stats.read_fraction == 1.0
    assert hosted > 0 and 0 < restored <= hosted
    assert len(answer.token_ids) == GREEDY.max_new_tokens
    _, _, _, _, sparse = return_to_a(tiny, "ranked", 530, LycheePolicy)  # the fixed 128-token read
    assert sparse.backend.sparse.stats.read_fraction < 0.9
