"""Per-(layer, KV head) retention (``policy.granularity=head``): each layer and KV head keeps its own
tokens, the same count in each, and attention over such a block is what transformers computes over
the same per-head gathered cache."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
import torch
from families import family
from hypothesis import HealthCheck, given, settings
from test_budget import watch_forwards
from test_policies import BUDGET, ops, run_ops
from transformers import DynamicCache

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.errors import UnsupportedModelError
from arbor_runtime.events import replay_resident
from arbor_runtime.policies import KVPPolicy, LycheePolicy, RandomPolicy, build_policy
from arbor_runtime.policies.base import MemoryView
from arbor_runtime.policies.scorer import FlatPool, ScorerPolicy

CONTEXT = list(range(100, 160))  # 60 tokens
QUESTION = list(range(300, 312))
PER_HEAD = ("random", "kvp", "streaming", "h2o", "snapkv", "thinkv", "arbor")


def per_head_runtime(tiny, name: str, **kwargs) -> tuple[Runtime, dict]:
    """A runtime under ``name`` at ``granularity=head`` recording each appended block's log-probs."""
    rt = Runtime(tiny, policy=build_policy(name, granularity="head", **kwargs))
    logps: dict[int, torch.Tensor] = {}
    rt.logits_hook = lambda node, logp: logps.__setitem__(node.id, logp.float())
    return rt, logps


@torch.no_grad()
def transformers_over(tiny, held: torch.Tensor, ids: list[int], start: int) -> tuple[list, torch.Tensor]:
    """transformers' own answer over a per-head compressed cache: prefill ``CONTEXT`` whole, keep in
    each layer and KV head the tokens ``held`` (L, H_kv, k) names, then run ``ids`` at their true
    positions. Returns the gathered (keys, values) per layer and the (len(ids), V) log-probs."""
    model, cache = tiny.model, DynamicCache()
    model(input_ids=torch.tensor([CONTEXT]), past_key_values=cache)
    kept, pruned = [], DynamicCache()
    for layer, entry in enumerate(cache.layers):
        idx = held[layer][None, :, :, None].expand(1, -1, -1, entry.keys.shape[-1])
        kept.append((entry.keys.gather(2, idx)[0], entry.values.gather(2, idx)[0]))
        pruned.update(entry.keys.gather(2, idx), entry.values.gather(2, idx), layer)
    if not ids:
        return kept, torch.zeros(0)
    positions = torch.arange(start, start + len(ids)).unsqueeze(0)
    logits = model(input_ids=torch.tensor([ids]), past_key_values=pruned, position_ids=positions).logits[0]
    return kept, torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.exactness
@pytest.mark.parametrize("name", ["random", "kvp"])
def test_a_per_head_block_reads_as_transformers_reads_the_same_per_head_cache(tiny, name):
    rt, logps = per_head_runtime(tiny, name)
    root = rt.new_tree_ids(CONTEXT)
    assert rt.compress(24) == 24
    keys, values, held = rt.store.read_heads(root.id)
    layers, kv_heads = rt.backend.shape.layers, rt.backend.shape.kv_heads
    assert held.shape == (layers, kv_heads, 24) and rt.store.get(root.id).per_head
    rows = held.reshape(layers * kv_heads, 24)
    assert len({tuple(r.tolist()) for r in rows}) > 1, "every layer and KV head kept the same tokens"
    for row in rows:  # each head keeps 24 distinct tokens of the block
        assert row.unique().numel() == 24 and int(row.max()) < len(CONTEXT)
    kept, ref = transformers_over(tiny, held, QUESTION, len(CONTEXT))
    for layer, (k, v) in enumerate(kept):  # the slots hold exactly those tokens' K/V, in every head
        torch.testing.assert_close(keys[layer], k, rtol=0, atol=1e-5)
        torch.testing.assert_close(values[layer], v, rtol=0, atol=1e-5)
    node = rt.append_ids(root, QUESTION)
    # row i of the block's log-probs predicts its token i (row 0 from the context's next logits)
    torch.testing.assert_close(logps[node.id][1:], ref[:-1], rtol=0, atol=1e-3)


def test_a_per_head_block_compressed_again_keeps_a_subset_in_each_head(tiny):
    rt, _ = per_head_runtime(tiny, "random", seed=5)
    root = rt.new_tree_ids(CONTEXT)
    rt.compress(30)
    _, _, before = rt.store.read_heads(root.id)
    node = rt.append_ids(root, QUESTION)  # whole slots after the per-head ones
    assert rt.store.read_heads(root.id)[2].shape[-1] == 30
    rt.compress(25)
    _, _, after = rt.store.read_heads(root.id)
    k = after.shape[-1]
    assert k + rt.store.get(node.id).kept_tokens == 25
    for a, b in zip(after.reshape(-1, k), before.reshape(-1, 30), strict=True):
        assert bool(torch.isin(a, b).all())
    kept, _ = transformers_over(tiny, after, [], len(CONTEXT))  # the K/V moved with their tokens
    keys, values, _ = rt.store.read_heads(root.id)
    for layer, (kk, vv) in enumerate(kept):
        torch.testing.assert_close(keys[layer], kk, rtol=0, atol=1e-5)
        torch.testing.assert_close(values[layer], vv, rtol=0, atol=1e-5)


@pytest.mark.exactness
@pytest.mark.parametrize("name", PER_HEAD)
def test_nothing_evicted_per_head_is_exactly_whole_token(tiny, name):
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop_at_eos=False)
    texts = []
    for granularity in ("token", "head"):
        rt = Runtime(tiny, policy=build_policy(name, granularity=granularity))
        (child,) = rt.expand(rt.new_tree_ids(CONTEXT), 1, params)
        texts.append(child.token_ids)
        assert not any(rt.store.get(i).per_head for i in rt.store.block_ids())
    assert texts[0] == texts[1]


@dataclass(slots=True)
class HashedScores(ScorerPolicy):
    """A scorer with fixed per-token and per-head scores (a hash of layer, head and token)."""

    name = "hashed"

    def sinks(self, cap: int) -> int:
        return 4

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        return (pool.token * 7 % 11).float() + pool.token * 1e-3  # no ties

    def head_scores(self, view: MemoryView, block: int, held: torch.Tensor, must: torch.Tensor) -> torch.Tensor:
        return hashed(held)


def hashed(held: torch.Tensor) -> torch.Tensor:
    layer = torch.arange(held.shape[0])[:, None, None]
    head = torch.arange(held.shape[1])[None, :, None]
    return ((held * 13 + layer * 5 + head * 3) % 17).float() + held * 1e-3


def test_each_head_keeps_its_own_top_k_and_the_protected_tokens(tiny):
    rt = Runtime(tiny, policy=HashedScores(granularity="head"))
    root = rt.new_tree_ids(CONTEXT)
    whole = rt.store.get(root.id).head_tokens(rt.backend.shape.layers, rt.backend.shape.kv_heads)
    rt.compress(20)
    _, _, held = rt.store.read_heads(root.id)
    scores = hashed(whole).masked_fill(whole < 4, float("inf"))  # the 4 sinks stay in every head
    direct = torch.sort(whole.gather(2, scores.topk(20, dim=-1).indices), dim=-1).values
    assert torch.equal(held, direct)
    others = torch.arange(4, 60)
    nominal = others[torch.topk((others * 7 % 11).float() + others * 1e-3, 16).indices]  # the whole-token plan
    assert torch.equal(rt.store.get(root.id).kept, torch.sort(torch.cat([torch.arange(4), nominal])).values)


@pytest.mark.parametrize("name", PER_HEAD)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops)
def test_per_head_budget_never_exceeded_and_events_replay(tiny, name, script):
    rt = Runtime(tiny, policy=build_policy(name, budget_tokens=BUDGET, granularity="head"))
    walked: list[int] = []
    watch_forwards(rt, walked)
    run_ops(rt, script)
    assert walked and max(walked) <= BUDGET * rt.backend.shape.bytes_per_token
    assert rt.metrics.peak_device_tokens <= BUDGET and rt.store.pool.peak_used <= BUDGET
    assert rt.store.pool.used == rt.store.resident_tokens
    for i in rt.store.block_ids():  # rectangular: every head holds as many tokens as the block has slots
        blk = rt.store.get(i)
        held = blk.head_tokens(rt.backend.shape.layers, rt.backend.shape.kv_heads)
        assert held.shape[-1] == blk.kept_tokens and bool((held < blk.length).all())
    assert replay_resident(rt.store.journal, rt.events) == [
        (r.resident_tokens, r.host_tokens) for r in rt.events.records
    ]


def test_a_tight_budget_search_runs_per_head(tiny):
    rt = Runtime(tiny, policy=RandomPolicy(budget_tokens=40, granularity="head"))
    root = rt.new_tree_ids(CONTEXT[:30])
    params = SamplingParams(max_new_tokens=10, temperature=1.0, stop_at_eos=False)
    for child in rt.expand(root, 2, params):
        rt.expand(child, 2, params)
    assert rt.metrics.peak_device_tokens <= 40
    assert any(rt.store.get(i).per_head for i in rt.store.block_ids())


def test_the_same_prompt_again_is_not_shared_from_a_per_head_block(tiny):
    rt, _ = per_head_runtime(tiny, "random")
    first = rt.new_tree_ids(CONTEXT)
    rt.compress(30)
    second = rt.new_tree_ids(CONTEXT)  # would share the first root's prefix, were it whole
    assert rt.store.get(first.id).per_head and second.id in rt.store
    assert rt.prefixes.prefix_ids() == []


def test_per_head_refusals(tiny):
    with pytest.raises(ValueError, match=r"granularity='heads'; valid: token, head"):
        build_policy("random", granularity="heads")
    with pytest.raises(ValueError, match="a sparse read ranks whole tokens"):
        LycheePolicy(memory=KVPPolicy(granularity="head"))
    with pytest.raises(UnsupportedModelError, match="sliding-window layers"):
        Runtime(family("mistral-window"), policy=RandomPolicy(granularity="head"))
    rt, _ = per_head_runtime(tiny, "random")
    root = rt.new_tree_ids(CONTEXT)
    rt.compress(20)
    with pytest.raises(ValueError, match="read it with read_heads"):
        rt.store.read(root.id)
    with pytest.raises(ValueError, match="cannot be split"):
        rt.store.split(root.id, -5, 10)
    kept = rt.store.get(root.id).kept
    _, _, held = rt.store.read_heads(root.id)
    wrong = held.clone()
    wrong[0, 0, -1] = int(torch.tensor([t for t in range(60) if t not in held[0, 0].tolist()][0]))
    with pytest.raises(ValueError, match="does not hold"):
        rt.store.apply_heads(root.id, kept, torch.sort(wrong, dim=-1).values)


@pytest.mark.exactness
@torch.no_grad()
def test_per_head_attention_record_is_what_each_kv_head_paid_in_transformers(tiny):
    rt = Runtime(tiny, policy=build_policy("h2o", granularity="head"))
    root = rt.new_tree_ids(CONTEXT)
    rt.append_ids(root, QUESTION)
    record = rt.store.get(root.id).head_attention  # (L, H_kv, 60): context and question queries
    model = tiny.model
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        out = model(input_ids=torch.tensor([CONTEXT + QUESTION]), output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    kv_heads = rt.backend.shape.kv_heads
    want = torch.stack([a[0].sum(dim=1) for a in out.attentions])  # (L, Hq, keys): summed over queries
    want = want.reshape(want.shape[0], kv_heads, -1, want.shape[-1]).sum(dim=2)[..., : len(CONTEXT)]
    torch.testing.assert_close(record, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["h2o", "snapkv"])
def test_per_head_records_sum_to_the_whole_token_record(tiny, name):
    rt = Runtime(tiny, policy=build_policy(name, granularity="head"))
    assert rt.store.head_stats
    root = rt.new_tree_ids(CONTEXT)
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_at_eos=False)
    rt.expand(rt.append_ids(root, QUESTION), 2, params)
    recorded = 0
    for i in rt.store.block_ids():
        blk = rt.store.get(i)
        if blk.head_attention is None:  # snapkv counts no decode query: nothing recorded either way
            assert not bool(blk.attention.any())
            continue
        torch.testing.assert_close(blk.head_attention.sum(dim=(0, 1)), blk.attention, rtol=1e-4, atol=1e-4)
        recorded += 1
    assert recorded >= (2 if name == "snapkv" else 4)
    assert not Runtime(tiny, policy=build_policy(name)).store.head_stats  # whole-token: not recorded


def test_h2o_per_head_keeps_each_heads_heavy_hitters_and_the_recent_window(tiny):
    rt = Runtime(tiny, policy=build_policy("h2o", granularity="head"))
    root = rt.new_tree_ids(CONTEXT)
    record = rt.store.get(root.id).head_attention.clone()  # (L, H_kv, 60) from the prompt's own queries
    rt.compress(24)  # heavy : recent = 1 : 1, so the 12 newest tokens stay in every head
    _, _, held = rt.store.read_heads(root.id)
    scores = record.masked_fill(torch.arange(60) >= 48, float("inf"))
    assert torch.equal(held, torch.sort(scores.topk(24, dim=-1).indices, dim=-1).values)
    assert len({tuple(r.tolist()) for r in held.reshape(-1, 24)}) > 1


def test_per_head_spans_offloaded_come_back_bit_identical(tiny):
    rt = Runtime(tiny, policy=build_policy("arbor", granularity="head"))
    root = rt.new_tree_ids(CONTEXT)
    keys, values = rt.store.read(root.id)  # (L, H_kv, 60, D) in token order
    layers, kv_heads = rt.backend.shape.layers, rt.backend.shape.kv_heads
    gen = torch.Generator().manual_seed(0)
    heads = torch.sort(torch.rand(layers, kv_heads, 60, generator=gen).topk(20, dim=-1).indices, dim=-1).values
    rt.store.apply_heads(root.id, torch.arange(20), heads, offload=True)
    k, v, held = rt.store.read_heads(root.id)
    assert torch.equal(held, heads) and rt.store.host_tokens == 40
    host_idx, hk, hv = rt.store.host.read(root.id)
    host_heads = rt.store.host.heads(root.id)  # (L, H_kv, 40): each head's own evicted tokens
    for layer in range(layers):
        for h in range(kv_heads):
            assert torch.equal(k[layer, h], keys[layer, h, heads[layer, h]])
            assert torch.equal(hv[layer, h], values[layer, h, host_heads[layer, h]])
            assert sorted(heads[layer, h].tolist() + host_heads[layer, h].tolist()) == list(range(60))
    rt.store.apply(root.id, torch.arange(60), offload=True)  # every host token back
    rt.store.prefetch()
    blk = rt.store.get(root.id)
    assert not blk.per_head and blk.whole and rt.store.host_tokens == 0
    back_k, back_v = rt.store.read(root.id)
    assert torch.equal(back_k, keys) and torch.equal(back_v, values)
    rt.store.apply_heads(root.id, torch.arange(20), heads, offload=True)  # and again, right after a restore
    rt.store.apply(root.id, torch.arange(60), offload=True)
    again = torch.flip(heads, dims=(1,))  # other heads' choices: evicted before the restore is issued
    rt.store.apply_heads(root.id, torch.arange(20), again, offload=True)
    k2, _, held2 = rt.store.read_heads(root.id)
    assert torch.equal(held2, again)
    for layer in range(layers):
        for h in range(kv_heads):
            assert torch.equal(k2[layer, h], keys[layer, h, again[layer, h]])


@pytest.mark.exactness
def test_arbor_per_head_under_a_tight_budget_generates_what_full_generates(tiny):
    """Inactive blocks keep their tokens per head; the active path comes back whole, bit-identical."""
    script = [("expand", random.Random(i).randrange(10_000), 1 + i % 2) for i in range(14)]
    full = Runtime(tiny, policy="full", seed=3)
    arbor = Runtime(tiny, policy=build_policy("arbor", budget_tokens=BUDGET, granularity="head"), seed=3)
    per_head = []
    run_ops(full, script)
    run_ops(
        arbor,
        script,
        on_op=lambda rt, *_: per_head.append(any(b.per_head for b in map(rt.store.get, rt.store.block_ids()))),
    )
    assert any(per_head), "no block was ever kept per head"
    assert arbor.metrics.rehydrations > 0 and arbor.metrics.peak_device_tokens <= BUDGET
    assert [n.token_ids for n in full.nodes.values()] == [n.token_ids for n in arbor.nodes.values()]


@pytest.mark.exactness
def test_a_per_head_block_that_lost_its_host_span_is_recomputed_whole(tiny):
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, stop_at_eos=False)
    full = Runtime(tiny, policy="full")
    (full_child,) = full.expand(full.new_tree_ids(CONTEXT), 1, greedy)
    rt = Runtime(tiny, policy=build_policy("arbor", granularity="head"))
    (child,) = rt.expand(rt.new_tree_ids(CONTEXT), 1, greedy)
    layers, kv_heads = rt.backend.shape.layers, rt.backend.shape.kv_heads
    heads = torch.stack([torch.arange(h, 8, 2)[:4] for h in range(kv_heads)]).expand(layers, -1, -1)
    rt.store.apply_heads(child.id, torch.arange(4), heads, offload=True)  # head h keeps h, h+2, h+4, h+6
    assert rt.store.drop_host(child.id) == 4  # what each head evicted is gone from every tier
    assert rt.residency(child) == {"device": 4, "host": 0, "dropped": 4}
    back = rt.expand(child, 1, greedy)[0]
    blk = rt.store.get(child.id)
    assert not blk.per_head and blk.whole and rt.metrics.recomputed_tokens >= 4
    assert back.token_ids == full.expand(full_child, 1, greedy)[0].token_ids


def test_the_per_head_section_recounts_its_means_from_the_context_rows():
    from benchmarks.per_head import build, context_rows

    def run(policy, ratio, kl, top1):
        return {"policy": policy, "compression_ratio": ratio, "kl": kl, "top1": top1, "retained": 0.5}

    contexts = [
        {"name": "a", "runs": [run("h2o", 0.5, [0.2, 0.4], [1, 0]), run("h2o@head", 0.5, [0.1, 0.1], [1, 1]),
                               run("kvp", 0.5, [0.3, 0.3], [1, 1]), run("kvp@head", 0.5, [0.05, 0.05], [1, 1]),
                               {"policy": "oracle", "compression_ratio": 0.5, "retained": 0.9}]},
        {"name": "b", "runs": [run("h2o", 0.5, [0.1, 0.1, 0.1, 0.1], [1, 1, 1, 1]),
                               run("h2o@head", 0.5, [0.2, 0.2, 0.2, 0.2], [1, 1, 0, 0]),
                               run("kvp", 0.5, [0.3] * 4, [1] * 4), run("kvp@head", 0.5, [0.0] * 4, [1] * 4)]},
    ]  # fmt: skip
    built = build(context_rows({"protocol": "compress", "per_context": contexts, "contexts": [], "steps": 2}), None)
    h2o = next(r for r in built["main"] if r["policy"] == "h2o")
    assert h2o["kl_token"] == pytest.approx((0.6 + 0.4) / 6) and h2o["kl_head"] == pytest.approx((0.2 + 0.8) / 6)
    assert h2o["top1_head"] == pytest.approx(4 / 6) and h2o["contexts_head_lower"] == "1/2"
    (best,) = built["tables"]["best"]["rows"]
    assert best["best"] == "kvp@head" and best["kvp_head_rank"] == 1
    facts = built["facts"]
    assert facts["compress_kvp_head_best"] == 1 and facts["compress_h2o_head_lower"] == 0
    assert facts["compress_h2o_head_worse"] == "none" and facts["compress_kvp_head_lower"] == 1
    assert len(built["tables"]["contexts"]["rows"]) == 8  # the oracle row carries no KL


def test_the_per_head_replay_pairs_each_policy_with_its_whole_token_self():
    from benchmarks.per_head_replay import summarise

    def row(policy, trace, kl, top1):
        return {"task": "game24", "budget_fraction": 0.5, "budget_tokens": 100, "policy": policy, "trace": trace,
                "mean_kl": kl, "top1_agreement": top1, "rehydrated_tokens": 0, "seconds": 1.0}  # fmt: skip

    rows = []
    for t in range(4):
        rows += [row("h2o", t, 0.2 + t / 100, 0.8), row("h2o:granularity=head", t, 0.1 + t / 100, 0.85)]
        rows += [row("kvp", t, 0.15, 0.9), row("kvp:granularity=head", t, 0.05 + t / 1000, 0.9)]
        rows += [row("streaming", t, 0.3, 0.7), row("streaming:granularity=head", t, 0.3, 0.7)]
    out = summarise(rows)
    paired = {r["policy"]: r for r in out.tables["head_vs_token"][1]}
    assert paired["h2o"]["verdict"] == "better" and paired["streaming"]["verdict"] == "identical"
    assert paired["kvp"]["trees"] == 4 and paired["kvp"]["verdict"] == "better"
    (best,) = out.tables["best"][1]
    assert best["best"] == "kvp:granularity=head" and best["kvp_head_rank"] == 1 and best["variants"] == 6
    assert out.facts["better"] == 2 and out.facts["identical"] == 1 and out.facts["worse_cells"] == "none"


def test_kvpress_runs_from_several_files_join_the_compress_rows_once_per_share():
    from benchmarks.per_head import kvpress_rows, press_runs

    main = [
        {"protocol": "compress", "kept": k, "policy": p, "kl_head": 0.1 * k, "kl_token": 0.2 * k}
        for p in ("streaming", "snapkv") for k in (0.9, 0.5)
    ] + [{"protocol": "budget", "kept": 0.5, "policy": "snapkv", "kl_head": 9.0, "kl_token": 9.0}]  # fmt: skip
    section = {"tables": {"main": {"rows": [
        {"policy": "streaming", "kvpress_press": "streaming", "kept": 50.0, "press_kl": 0.05, "token_kl": 0.1},
        {"policy": "snapkv", "kvpress_press": "snapkv", "kept": 50.0, "press_kl": 0.04, "token_kl": 0.2},
    ]}}}  # fmt: skip
    bench = {"comparison": [
        {"policy": "snapkv", "press": "snapkv", "kept_share": 0.9, "press_kl": 0.09, "token_kl": 0.18},
        {"policy": "snapkv", "press": "snapkv", "kept_share": 0.5, "press_kl": 1.0, "token_kl": 1.0},
    ]}  # fmt: skip
    rows = kvpress_rows(main, press_runs(section) + press_runs(bench))
    assert [(r["policy"], r["kept"]) for r in rows] == [("streaming", 0.5), ("snapkv", 0.9), ("snapkv", 0.5)]
    snap50 = rows[2]  # the share in both files: the first file's run, against the compress protocol's row
    assert snap50["press_kl"] == 0.04 and snap50["head_vs_press"] == pytest.approx(0.05 / 0.04)
    assert rows[1]["head_vs_press"] == pytest.approx(0.09 / 0.09) and rows[1]["press_token_kl"] == 0.18


def test_the_committed_per_head_section_recounts_from_its_context_rows_and_kvpress_runs():
    from benchmarks.per_head import KVPRESS_FACTS, STEP_FACTS, build, press_runs
    from benchmarks.results.data import DATA, load_section

    data, linear = load_section("per-head"), load_section("linear")
    extra = json.loads((DATA / "per-head" / "linear-7590.json").read_text())  # bench_linear.py at 90 / 75%
    runs = press_runs(linear) + press_runs(extra)
    built = build(data["tables"]["contexts"]["rows"], {"rows": data["tables"]["step"]["rows"]}, runs)
    assert built["main"] == data["tables"]["main"]["rows"] and built["facts"] == data["facts"]
    assert built["tables"]["kvpress"]["rows"] == data["tables"]["kvpress"]["rows"]
    assert data["facts"]["snapkv_press_shares"] == "90%, 75%, 50%, 25%, 10%"  # issue 66: 10-90% kept
    assert set(KVPRESS_FACTS) | set(STEP_FACTS) <= set(built["facts"])  # the names --keep redoes are build's
