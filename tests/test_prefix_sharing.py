"""Prefixes shared across trees (issue 23): a prompt's stored prefix is attached to, not prefilled again.

Exactness against separate runtimes (greedy and sampled, forced blocks, strict-prefix and identical
prompts), the memory it saves (the issue's two-prompt reproduction, on the tiny model), reference
counting under releases in any order, the store's block cut (bit-identical K/V on both tiers), and a
budget property test with many trees sharing prefixes under h2o and arbor.
"""

from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch
from floats import reassociation_tol
from hypothesis import given, settings
from hypothesis import strategies as st

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.events import replay_resident
from arbor_runtime.kv import BlockKV, KVShape, KVStore
from arbor_runtime.prefix import MIN_SHARED_TOKENS

pytestmark = pytest.mark.exactness  # CI runs these again under another ATEN_CPU_CAPABILITY

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, stop_at_eos=False)
# top_k: the random model's distribution is nearly uniform over 49k tokens, where float noise between
# two summation orders moves the sampled token (as in test_budget)
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=20, seed=5, stop_at_eos=False)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def _prompts() -> list[list[int]]:
    """Prompts over one 60-token prefix: suffixes of different lengths, a strict prefix of another
    prompt, an identical pair, and one of another family (nothing in common)."""
    rng = random.Random(7)
    base = _ids(rng, 60)
    long_a = base + _ids(rng, 9)
    return [long_a, base + _ids(rng, 1), base + _ids(rng, 23), long_a[:64], list(long_a), _ids(rng, 40)]


def _tree_outputs(rt: Runtime, root, sampling: SamplingParams):
    """Root's next-token log-probs, two children, and the log-probs of a forced block and of two
    scored choices (one kept) under the root."""
    kids = rt.expand(root, 2, sampling)
    forced = rt.append_ids(root, [321, 654, 987])
    chosen = rt.choose(root, [" yes it is", " no"], keep=1)
    scored = forced.logprobs + [p for lps in chosen.token_logprobs for p in lps] + chosen.kept[0].logprobs
    return rt.next_token_logprobs(root), [(k.token_ids, k.logprobs) for k in kids], scored


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_shared_prefix_trees_equal_separate_runtimes(tiny, one_torch_thread, sampling):
    prompts = _prompts()
    shared = Runtime(tiny, policy="full", fast_kernel=False)
    roots = [shared.new_tree_ids(p) for p in prompts]
    assert [r.token_ids for r in roots] == prompts  # the public view is the whole prompt
    assert all(r.parent is None and r.start_pos == 0 and r.path() == [r] for r in roots)
    assert shared.metrics.prefix_trees == 4  # all but the first and the other family
    got = [_tree_outputs(shared, r, sampling) for r in roots]
    for prompt, (dist, kids, forced) in zip(prompts, got, strict=True):
        alone = Runtime(tiny, policy="full", fast_kernel=False, share_prefixes=False)
        want_dist, want_kids, want_forced = _tree_outputs(alone, alone.new_tree_ids(prompt), sampling)
        assert torch.allclose(dist, want_dist, atol=reassociation_tol(tiny, want_dist.tolist()), rtol=0)
        for (ids, lps), (want_ids, want_lps) in zip(kids, want_kids, strict=True):
            assert ids == want_ids
            assert max(abs(a - b) for a, b in zip(lps, want_lps, strict=True)) <= reassociation_tol(tiny, want_lps)
        assert max(abs(a - b) for a, b in zip(forced, want_forced, strict=True)) <= reassociation_tol(tiny, forced)


def test_two_prompts_differing_in_the_last_line_store_the_prefix_once(tiny, one_torch_thread):
    """The issue's reproduction, in small: two long prompts that differ only in the last line."""
    few_shot = "".join(f"Input: {a} {b} {a + b}\nAnswer: {a * b}\n" for a, b in itertools.product(range(2, 7), (3, 5)))
    texts = [few_shot + "Input: 4 4 6 8\n", few_shot + "Input: 2 9 10 10\n"]
    ids = [tiny.tokenizer(t)["input_ids"] for t in texts]
    common = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
    assert common > 100
    runs = {}
    for share in (False, True):
        rt = Runtime(tiny, policy="full", share_prefixes=share)
        roots = [rt.new_tree(t) for t in texts]
        runs[share] = (rt, roots)
    off, on = runs[False][0], runs[True][0]
    total = len(ids[0]) + len(ids[1])
    assert off.store.resident_tokens == off.metrics.prefill_tokens == total
    assert on.store.resident_tokens == on.metrics.prefill_tokens == total - common
    assert on.metrics.peak_device_tokens == total - common
    assert on.metrics.prefix_prefill_saved_tokens == on.metrics.prefix_resident_saved_tokens == common
    assert (off.metrics.prefix_trees, on.metrics.prefix_trees) == (0, 1)
    # stored once: the prefix block, then each prompt's own suffix
    (prefix_id,) = on.prefixes.prefix_ids()
    assert on.store.get(prefix_id).length == common and on.prefixes.users(prefix_id) == 2
    for root, n in zip(runs[True][1], map(len, ids), strict=True):
        assert [b.id for b in root.kv_path()] == [prefix_id, root.id]
        assert on.residency(root)["device"] == n - common


def test_oplog_replay_rebuilds_the_sharing_and_a_copy_keeps_it(tiny, one_torch_thread):
    from benchmarks.replay import replay_trace
    from benchmarks.trace import Trace

    few_shot = "".join(f"Example {i}: {i} plus {i} is {2 * i}.\n" for i in range(12))
    rt = Runtime(tiny, policy="full")
    roots = [rt.new_tree(few_shot + q) for q in ("Now: 3 plus 4?", "Now: 8 plus 1?", "Now: 3 plus 4?")]
    for r in roots:
        rt.append(rt.expand(r, 1, GREEDY)[0], " so")
    rt.release(roots[0])
    assert rt.metrics.prefix_trees == 2
    # the journal replays the resident and host totals, the cuts included
    logged = [(e.resident_tokens, e.host_tokens) for e in rt.events.records]
    assert replay_resident(rt.store.journal, rt.events) == logged
    run = replay_trace(tiny, Trace.from_runtime(rt, "tiny-random"), "arbor", budget_tokens=200)
    assert run.error is None and run.fidelity.max_abs_dlogp <= reassociation_tol(tiny, [run.fidelity.scale])
    assert run.metrics["prefix_trees"] == 2
    assert run.metrics["prefix_prefill_saved_tokens"] == rt.metrics.prefix_prefill_saved_tokens
    # a deep copy holds its own prefix blocks: it expands the same, and releasing there leaves this one whole
    clone = copy.deepcopy(rt, {id(tiny.model): tiny.model, id(tiny.tokenizer): tiny.tokenizer})
    twin = clone.nodes[roots[1].id]
    assert [b.id for b in twin.kv_path()] == [b.id for b in roots[1].kv_path()]
    assert clone.expand(twin, 1, GREEDY)[0].token_ids == rt.expand(roots[1], 1, GREEDY)[0].token_ids
    clone.release(twin)
    clone.release(clone.nodes[roots[2].id])
    assert clone.store.pool.used == 0 and set(rt.store.block_ids()) >= {b.id for b in roots[1].kv_path()}


def test_share_prefixes_false_keeps_one_block_per_prompt(tiny, one_torch_thread):
    prompts = _prompts()
    rt = Runtime(tiny, policy="full", share_prefixes=False)
    roots = [rt.new_tree_ids(p) for p in prompts]
    assert sorted(rt.store.block_ids()) == [r.id for r in roots] and not rt.prefixes.nodes
    assert rt.store.resident_tokens == rt.metrics.prefill_tokens == sum(map(len, prompts))
    assert all(r.kv is None and r.kv_path() == [r] for r in roots)
    assert rt.metrics.prefix_prefill_saved_tokens == rt.metrics.prefix_trees == 0
    with pytest.raises(ValueError, match="share_prefixes='yes' must be true or false"):
        Runtime(tiny, share_prefixes="yes")


def test_a_short_common_prefix_is_not_shared(tiny, one_torch_thread):
    rng = random.Random(3)
    head = _ids(rng, MIN_SHARED_TOKENS - 1)
    rt = Runtime(tiny, policy="full")
    rt.new_tree_ids(head + _ids(rng, 20))
    rt.new_tree_ids(head + _ids(rng, 20))
    assert not rt.prefixes.nodes and rt.metrics.prefix_trees == 0


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_releases_in_any_order_free_only_what_no_tree_reads(tiny, one_torch_thread, order):
    rng = random.Random(11)
    base = _ids(rng, 50)
    prompts = [base + _ids(rng, 5), base[:30] + _ids(rng, 8), base + _ids(rng, 12)]
    rt = Runtime(tiny, policy="full")
    roots = [rt.new_tree_ids(p) for p in prompts]
    kids = [rt.expand(r, 1, GREEDY)[0] for r in roots]
    assert len(rt.prefixes.prefix_ids()) == 2  # [0, 30) for all, [30, 50) for the first and third
    live = set(range(3))
    for i in order:
        rt.release(roots[i])
        live.discard(i)
        used = {b.id for j in live for b in kids[j].kv_path()}
        assert set(rt.store.block_ids()) == used  # nothing another tree reads went; nothing leaked
        assert rt.store.resident_tokens == sum(rt.store.get(b).length for b in used)
        for j in live:  # the trees left still expand as before
            again = rt.expand(roots[j], 1, GREEDY)[0]
            assert again.token_ids == kids[j].token_ids
            rt.release(again)
    assert rt.store.pool.used == 0 and not rt.prefixes.nodes


def test_store_split_cuts_both_tiers_without_moving_a_token():
    shape = KVShape(layers=2, kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))
    store = KVStore(shape, capacity=64)
    n, start = 20, 5
    exts = store.pool.alloc(n)
    slots = torch.cat([torch.arange(e.start, e.end) for e in exts])
    k, v = torch.randn(2, 2, n, 4), torch.randn(2, 2, n, 4)
    store.pool.write(slots, k, v)
    store.put(1, BlockKV.from_extents(exts, start, torch.zeros(3)))
    store.get(1).attention = torch.arange(n, dtype=torch.float32)
    keep = torch.tensor([0, 1, 4, 9, 12, 13, 19])
    store.apply(1, keep, offload=True)  # the rest to the host tier, on both sides of the cut
    resident, host = store.resident_tokens, store.host_tokens
    store.split(1, -1, 10)
    head, tail = store.get(-1), store.get(1)
    assert (head.start_pos, head.length, tail.start_pos, tail.length) == (start, 10, start + 10, 10)
    assert head.kept.tolist() == [0, 1, 4, 9] and tail.kept.tolist() == [2, 3, 9]
    assert torch.equal(head.attention, torch.arange(10.0)) and torch.equal(tail.attention, torch.arange(10.0, 20))
    assert (store.resident_tokens, store.host_tokens) == (resident, host)
    for block, offset in ((-1, 0), (1, 10)):
        kk, vv = store.read(block)
        idx = store.get(block).kept + offset
        assert torch.equal(kk, k[:, :, idx]) and torch.equal(vv, v[:, :, idx])
        hidx, hk, hv = store.host.read(block)
        assert torch.equal(hk, k[:, :, hidx + offset]) and torch.equal(hv, v[:, :, hidx + offset])
    store.apply(-1, torch.arange(10), offload=True)  # the prefix comes back whole, bit-identical
    store.prefetch()
    assert torch.equal(store.read(-1)[0], k[:, :, :10])
    store.pop(-1)
    store.pop(1)
    assert store.pool.used == 0 and store.host_tokens == 0


# ---- the budget property test ---------------------------------------------------------------------
FAMILIES = [_ids(random.Random(100 + f), 36) for f in range(2)]
SUFFIXES = [_ids(random.Random(200 + s), 3 + 4 * s) for s in range(4)]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(0, 1), st.integers(0, 4)),
        st.tuples(st.just("expand"), st.integers(0, 7), st.integers(1, 2)),
        st.tuples(st.just("release"), st.integers(0, 7), st.just(0)),
    ),
    min_size=4,
    max_size=14,
)


def _prompt(family: int, kind: int) -> list[int]:
    """A family's prefix with one of the suffixes, or (kind 4) a strict prefix of the family's prompts."""
    base = FAMILIES[family]
    return base[:24] if kind == 4 else base + SUFFIXES[kind]


def _token_kv(rt: Runtime) -> dict[tuple, torch.Tensor]:
    """K/V of every token held on some tier, (L, 2, H, D) each: a prompt token (computed once for every
    tree that shares it, wherever a cut moved it) by the token ids of its path up to it, any other by
    its block and index. A key held twice (identical prompts keep their last token each) is left out."""
    out, twice = {}, set()
    for block_id in rt.store.block_ids():
        node = rt.memory.nodes[block_id]
        path = [t for b in node.kv_path() for t in b.token_ids] if node.kind == "prompt" else None
        blk = rt.store.get(block_id)
        k, v = rt.store.read(block_id)
        parts = [(blk.kept, k, v)]
        if block_id in rt.store.host:
            parts.append(rt.store.host.read(block_id))
        for idx, kk, vv in parts:
            for j, i in enumerate(idx.tolist()):
                key = tuple(path[: blk.start_pos + i + 1]) if path else (block_id, i)
                if key in out:
                    twice.add(key)
                out[key] = torch.stack([kk[:, :, j], vv[:, :, j]], 1)
    return {k: v for k, v in out.items() if k not in twice}


@pytest.mark.parametrize("policy", ["h2o", "arbor"])
@settings(max_examples=12, deadline=None)
@given(ops=OPS)
def test_many_trees_sharing_prefixes_under_a_small_budget(tiny, one_torch_thread, policy, ops):
    budget = 140  # a path grows to 51 + 13 * 4 tokens, plus two rows of 4
    rt = Runtime(tiny, policy=policy, budget_tokens=budget)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1, stop_at_eos=False)
    trees, seen = [], {}
    for op, a, b in ops:
        if op == "new":
            trees.append(rt.new_tree_ids(_prompt(a, b)))
        elif trees and op == "expand":
            root = trees[a % len(trees)]
            leaf = max(root.subtree(), key=lambda n: (n.depth, n.id))
            rt.expand(leaf, b, sampling)
        elif trees and op == "release":
            rt.release(trees.pop(a % len(trees)))
        # never over the budget, by what is allocated
        assert rt.store.pool.used <= budget and rt.metrics.peak_device_tokens <= budget
        assert rt.device_kv_bytes() == budget * rt.store.shape.bytes_per_token
        # no block freed while a tree reads it, none kept that no tree reads
        used = {b.id for t in trees for n in t.subtree() for b in n.kv_path()}
        assert set(rt.store.block_ids()) == used
        assert all(rt.prefixes.users(i) > 0 for i in rt.prefixes.prefix_ids())
        if policy == "arbor":  # nothing is dropped: every token's K/V is what it was when computed
            now = _token_kv(rt)
            for key, kv in now.items():
                if key in seen:
                    assert torch.equal(kv, seen[key])
            seen = now
    for t in trees:
        rt.release(t)
    assert rt.store.pool.used == 0 and rt.store.host_tokens == 0 and not rt.prefixes.nodes
