"""KVP: scorer shapes and determinism, training, weights by fingerprint, the policy under a budget."""

from __future__ import annotations

import itertools

import pytest
import torch
from fixtures.tiny_llama import tiny_llama
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from test_budget import watch_forwards
from test_policies import BUDGET, ops, run_ops

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import ArborPolicy, KVPPolicy, build_policy
from arbor_runtime.policies.kvp_scorer import KVPScorer, ScorerShape, pooled_token_scores
from arbor_runtime.policies.kvp_weights import (
    WEIGHTS_DIR,
    KVPWeightsError,
    load_weights,
    model_fingerprint,
    read_metadata,
    save_weights,
    scorer_shape_of,
    shipped_weights,
)
from research.kvp.collect import Sequence, collect, future_attention, read_shards, record_tensors
from research.kvp.texts import solve24, training_texts
from research.kvp.train import (
    LOSS_FNS,
    LOSSES,
    TrainConfig,
    evaluate,
    head_tensors,
    plackett_luce_log_prob,
    ranking_auc,
    retained_auc,
    rloo_loss,
    train,
)  # fmt: skip

SHAPE = ScorerShape(layers=2, kv_heads=2, head_dim=16, embed=8, hidden=8)
PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0)


def kv(shape: ScorerShape, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(shape.heads, n, shape.head_dim, generator=gen)
    return k, torch.randn(shape.heads, n, shape.head_dim, generator=gen), torch.arange(n) + 3


# ---- the scorer -----------------------------------------------------------------------------
def test_scorer_shapes_and_determinism():
    k, v, pos = kv(SHAPE, 11)
    a, b = KVPScorer(SHAPE, seed=4)(k, v, pos), KVPScorer(SHAPE, seed=4)(k, v, pos)
    assert a.shape == (SHAPE.heads, 11) and torch.equal(a, b)
    assert not torch.equal(a, KVPScorer(SHAPE, seed=5)(k, v, pos))
    # a token's score depends on that token alone: scoring a subset gives the same numbers
    assert torch.allclose(KVPScorer(SHAPE, seed=4)(k[:, 3:7], v[:, 3:7], pos[3:7]), a[:, 3:7], atol=1e-6)
    layered = KVPScorer(SHAPE, seed=4).score_layers(k.view(2, 2, 11, 16), v.view(2, 2, 11, 16), pos)
    assert torch.allclose(layered, a)


def test_scorer_rejects_wrong_shapes():
    k, v, pos = kv(SHAPE, 5)
    with pytest.raises(ValueError, match=r"expects keys and values of shape \(G=4, N, 16\)"):
        KVPScorer(SHAPE)(k[:3], v[:3], pos)
    with pytest.raises(ValueError, match=r"positions \(4,\) must be \(N,\) = \(5,\)"):
        KVPScorer(SHAPE)(k, v, pos[:4])
    with pytest.raises(ValueError, match="scorer embed=0"):
        ScorerShape(2, 2, 16, embed=0)


def test_pooled_token_scores_are_mean_head_shares():
    scores = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))
    assert torch.allclose(pooled_token_scores(scores), torch.tensor([0.4, 0.15, 0.45]))


def test_retained_auc_of_the_oracle_beats_the_reverse_ranking():
    target = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(0)), -1)
    best, worst = retained_auc(target, target), retained_auc(-target, target)
    assert bool((best > worst).all()) and bool((best <= 1.0 + 1e-6).all())


# ---- data and training on the tiny model ----------------------------------------------------
def tiny_sequences(tiny, count: int) -> list[Sequence]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(count):
        ids = torch.randint(10, 4000, (60 + 5 * i,), generator=gen).tolist()
        t = record_tensors(future_attention(tiny.model, ids, 40 + 5 * i), i)
        out.append(Sequence(t[f"{i:05d}.keys"], t[f"{i:05d}.values"], t[f"{i:05d}.attention"], "random"))
    return out


def test_future_attention_matches_the_model_and_records_every_layer(tiny):
    ids = list(range(20, 70))
    probe = future_attention(tiny.model, ids, 30)
    assert len(probe.keys) == 2 and probe.keys[0].shape == (2, 30, 16) and probe.attention[0].shape == (2, 30)
    mass = torch.stack(probe.attention).sum(-1)  # mean over queries of the mass on the context
    assert bool((mass > 0).all()) and bool((mass < 1).all())
    with pytest.raises(ValueError, match="context=50 must leave at least one future token of 50"):
        future_attention(tiny.model, ids, 50)


@pytest.mark.parametrize("loss", LOSSES)
def test_a_few_training_steps_lower_the_loss(tiny, loss):
    seqs = tiny_sequences(tiny, 3)
    shape = scorer_shape_of(tiny.model, embed=8, hidden=8)

    def mean_loss(scorer):  # rloo's loss is a sampled surrogate: what it raises is the retained-mass AUC
        with torch.no_grad():
            if loss == "rloo":
                return (
                    -sum(float(retained_auc(scorer(*head_tensors(s)[:3]), head_tensors(s)[3]).mean()) for s in seqs) / 3
                )
            return sum(float(LOSS_FNS[loss](scorer(*head_tensors(s)[:3]), head_tensors(s)[3])) for s in seqs) / 3

    before = mean_loss(KVPScorer(shape, seed=0))
    result = train(shape, seqs, seqs[:1], TrainConfig(loss=loss, epochs=10, lr=1e-2, eval_every=10, embed=8, hidden=8))
    assert len(result.losses) == 30 and result.evals[-1][0] == 30
    assert mean_loss(result.scorer) < before - 1e-3
    assert set(evaluate(result.scorer, seqs[:1], ("recency",))) >= {
        "kvp/head_auc",
        "oracle/token_auc",
        "recency/head_auc",
    }


def test_collect_writes_shards_under_the_disk_cap(tiny, tmp_path, data_dir):
    count = lambda text: len(tiny.tokenizer(text)["input_ids"])  # noqa: E731
    texts = list(
        training_texts(data_dir, 4, seed=0, min_context=40, max_context=80, count_tokens=count, game24_share=1.0)
    )
    assert all(t.source == "game24" and not set(t.rows) & set(range(900, 1000)) for t in texts)
    summary = collect(tiny, texts, tmp_path / "all", max_bytes=10**8)
    seqs = read_shards(tmp_path / "all", model_fingerprint(tiny.model))
    assert summary["sequences"] == len(seqs) == 4 and not summary["capped"]
    assert seqs[0].keys.dtype == torch.float16 and seqs[0].attention.shape == seqs[0].keys.shape[:3]
    one = seqs[0].keys.numel() * 4 + seqs[0].attention.numel() * 4
    capped = collect(tiny, texts, tmp_path / "capped", max_bytes=one + 1)
    assert capped["capped"] and capped["sequences"] == 1
    with pytest.raises(ValueError, match="collected with model fingerprint"):
        read_shards(tmp_path / "all", "0" * 16)
    with pytest.raises(ValueError, match="no rows from 100 on"):
        next(training_texts(data_dir, 1, 0, 40, 80, count, game24_share=0.0))


def test_solve24_reaches_24():
    from fractions import Fraction

    steps = solve24([Fraction(n) for n in (4, 4, 6, 8)])
    assert steps and steps[-1].endswith("(left: 24)") and solve24([Fraction(1)] * 4) is None


# ---- weights by fingerprint -----------------------------------------------------------------
def test_shipped_weights_load_and_score(tiny):
    loaded = load_weights(shipped_weights(model_fingerprint(tiny.model)), model_fingerprint(tiny.model))
    k, v, pos = kv(loaded.scorer.shape, 9)
    scores = loaded.scorer(k, v, pos)
    assert scores.shape == (4, 9) and bool(torch.isfinite(scores).all()) and scores.std() > 0
    assert loaded.info["sequences"]["train"] > 0 and "kvp_train.py" in loaded.info["command"]


def test_shipped_smollm2_weights_fit_smollm2():
    meta = read_metadata(WEIGHTS_DIR / "kvp-smollm2.safetensors")
    assert '"layers": 30' in meta["shape"] and '"kv_heads": 3' in meta["shape"] and '"head_dim": 64' in meta["shape"]


@pytest.mark.slow
def test_shipped_smollm2_weights_match_the_default_model(smollm2):
    assert shipped_weights(model_fingerprint(smollm2.model)).name == "kvp-smollm2.safetensors"


def test_weights_of_another_model_are_refused(tiny, tmp_path):
    other = tiny_llama(seed=7).model
    assert model_fingerprint(other) != model_fingerprint(tiny.model)
    path = save_weights(tmp_path / "other.safetensors", KVPScorer(scorer_shape_of(other)), model_fingerprint(other), {})
    with pytest.raises(KVPWeightsError, match=f"trained for model fingerprint {model_fingerprint(other)}"):
        Runtime(tiny, policy=KVPPolicy(budget_tokens=BUDGET, weights=str(path)))
    with pytest.raises(KVPWeightsError, match="no KVP weights shipped for the model"):
        Runtime(tiny_llama(seed=7), policy="kvp")
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(1)}, str(plain))
    with pytest.raises(KVPWeightsError, match="is not a KVP weights file"):
        load_weights(plain)


def test_fingerprint_ignores_dtype(tiny):
    half = tiny_llama(seed=7).model
    assert model_fingerprint(half) == model_fingerprint(half.to(torch.float16))


# ---- the policy -----------------------------------------------------------------------------
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops, seed=st.integers(0, 3))
def test_kvp_as_arbor_token_scorer_keeps_the_budget(tiny, script, seed):
    rt = Runtime(tiny, policy=ArborPolicy(budget_tokens=BUDGET, token_scorer="kvp"), seed=seed)
    walked: list[int] = []
    watch_forwards(rt, walked)
    run_ops(rt, script)
    assert walked and max(walked) <= BUDGET * rt.backend.shape.bytes_per_token
    assert rt.metrics.peak_device_tokens <= BUDGET
    for block_id in rt.memory.active:
        assert rt.store.get(block_id).whole


def test_kvp_keeps_its_top_scored_tokens_and_scores_each_token_once(tiny):
    rt = Runtime(tiny, policy="kvp", budget_tokens=BUDGET, seed=2)
    run_ops(rt, [("expand", i * 5, 2) for i in range(8)])
    policy = rt.policy
    assert rt.metrics.evicted_tokens > 0 and rt.store.host_tokens == 0
    created = sum(n.length for n in rt.all_nodes.values())
    assert 0 < policy.scores.scored_tokens <= created  # no token scored twice
    for block_id in rt.store.block_ids():  # cached scores equal fresh scores of the stored K/V
        blk = rt.store.get(block_id)
        keys, values = rt.store.read(block_id)
        fresh = policy.scores.scorer.score_layers(keys, values, blk.positions)
        cached, seen = policy.scores._cache[block_id]
        assert bool(seen[blk.kept].all()) and torch.allclose(cached[:, blk.kept], fresh, atol=1e-5)


def test_kvp_plan_keeps_exactly_the_top_tokens(tiny):
    rt = Runtime(tiny, policy="kvp", seed=0)
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    rt.expand(root, 2, PARAMS)
    view = rt.memory.view(target=10)
    scores = rt.policy.scores.token_scores(view)
    plan = rt.policy.plan(view)
    keep = torch.cat([torch.isin(b.kv.kept, plan.keep.get(b.node.id, b.kv.kept)) for b in view.blocks])
    assert int(keep.sum()) == 10
    window = rt.policy.recent_window(10)  # the newest tokens of the pool, then the top scores of the rest
    assert window == 5 and bool(keep[-window:].all())
    rest = scores[:-window]
    assert set(torch.nonzero(keep[:-window]).squeeze(1).tolist()) == set(rest.topk(10 - window).indices.tolist())


def test_kvp_configuration_errors():
    with pytest.raises(ValueError, match="kvp sink_tokens=-1"):
        build_policy("kvp", sink_tokens=-1)
    with pytest.raises(ValueError, match="arbor token_scorer='norm'; valid: attention, kvp"):
        ArborPolicy(token_scorer="norm")
    with pytest.raises(RuntimeError, match="not bound to a model"):
        KVPPolicy(budget_tokens=10).scores.token_scores(None)


# ---- the scripts, end to end on the tiny model -----------------------------------------------
def test_scripts_collect_train_bench_and_render_the_section(tmp_path, data_dir, capsys):
    import json

    from benchmarks.results.collect import write as collect
    from benchmarks.results.data import load_section
    from benchmarks.results.sections import Section, render_section
    from benchmarks.results.tables import cell
    from research.kvp.cli import bench_main, collect_main, train_main

    data, weights = tmp_path / "kvp" / "data", tmp_path / "w.safetensors"
    common = ["--model", "tiny-random", "--data-dir", str(data_dir), "--threads", "1"]
    argv = [*common, "--out", str(data), "--sequences", "6", "--min-context", "40", "--max-context", "60"]
    assert collect_main([*argv, "--game24-share", "1.0"]) == 0
    kvp = tmp_path / "kvp"
    train = ["--data", str(data), "--out", str(weights), "--plot", str(kvp / "train.png"), "--threads", "1"]
    assert (
        train_main([*train, "--report", str(kvp / "train.json"), "--epochs", "2", "--embed", "8", "--hidden", "8"]) == 0
    )
    info = load_weights(weights).info
    assert info["sequences"]["train"] == 5 and info["sequences"]["held_out"] == 1 and info["loss"] == "listnet"
    # a bench.json beside the training reports would be the section's table2: this one has too few rows
    bench = [*common, "--out", str(tmp_path / "bench.json"), "--contexts", "gsm8k:1:0", "--shares", "0.5"]
    bench += ["--steps", "2"]
    assert bench_main([*bench, "--policies", "kvp,streaming"]) == 0
    budget_out = kvp / "bench-budget.json"
    budget_argv = [*common, "--out", str(budget_out), "--contexts", "gsm8k:1:0", "--shares", "0.5,0.25", "--steps", "2"]
    variant = ["--variants", "kvp-pure=recent_ratio:0"]
    assert bench_main([*budget_argv, "--policies", "kvp,h2o", *variant, "--protocol", "budget"]) == 0
    budget = json.loads(budget_out.read_text())
    assert budget["protocol"] == "budget" and budget["cost"] == {}
    assert {(r["policy"], r["kept_share"]) for r in budget["rows"] if "mean_kl" in r} == {
        (p, s) for p in ("kvp", "h2o", "kvp-pure") for s in (0.5, 0.25)
    }
    context_tokens = budget["contexts"][0]["context_tokens"]
    for run in budget["per_context"][0]["runs"]:  # the context tokens still kept fit the budget
        if "kl" in run:
            assert 0 < run["kept_tokens"] <= int(context_tokens * (1 - run["compression_ratio"]))
            assert len(run["kl"]) == 2 and all(x >= 0 for x in run["kl"])
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {r["policy"] for r in rows} == {"oracle", "kvp", "streaming"}
    assert all(0 <= r["retained"] <= 1 + 1e-6 for r in rows)
    oracle = next(r["retained"] for r in rows if r["policy"] == "oracle")
    assert all(r["retained"] <= oracle + 1e-6 for r in rows)
    assert bench_main(["--shares", "1.5"]) == 2 and "--shares '1.5' must be in (0, 1)" in capsys.readouterr().err
    assert bench_main(["--variants", "x=recent_ratio:half"]) == 2
    assert "recent_ratio:'half' is not a number" in capsys.readouterr().err
    # kvp_train's reports -> docs/data/kvp (benchmarks.results.collect) -> the section through its template,
    # which quotes every loss: train the other two too, as the section's command does
    for loss in ("budgets", "rloo"):
        train_other = ["--data", str(data), "--out", str(tmp_path / f"w-{loss}.safetensors"), "--loss", loss]
        train_other += ["--plot", str(kvp / f"train-{loss}.png"), "--report", str(kvp / f"train-{loss}.json")]
        assert train_main([*train_other, "--threads", "1", "--epochs", "2", "--embed", "8", "--hidden", "8"]) == 0
    collect("kvp", kvp, "python scripts/kvp_train.py --data bench/kvp/data", data_root=tmp_path / "docs-data")
    text = render_section(Section("kvp"), load_section("kvp", tmp_path / "docs-data"))
    assert text.startswith("## KVP: learned per-head eviction scorers vs h2o / snapkv / streaming\n")
    report, other = (json.loads((kvp / name).read_text()) for name in ("train.json", "train-budgets.json"))
    row = [report["seconds"], 5, 1] + [report["final"][f"{m}/head_auc"] for m in ("kvp", "oracle", "knorm")]
    assert "| listnet | " + " | ".join(map(cell, row)) + " |" in text
    head = (other["final"]["kvp/head_auc"], report["final"]["kvp/head_auc"])
    assert "held-out AUC ({:.3f} vs {:.3f} per head)".format(*head) in text  # the prose follows the new table
    # each loss's training curve is in the data (kvp-train.png is drawn from it): its mean loss per point and
    # the held-out AUC at each eval
    curve = load_section("kvp", tmp_path / "docs-data")["tables"]["curve"]["rows"]
    for rep in (report, other):
        mine = [p for p in curve if p["loss"] == rep["settings"]["loss"]]
        points = [p["train_loss"] for p in mine if p["train_loss"] is not None]
        assert len(rep["losses"]) <= 120 and points == rep["losses"]  # a short run keeps every step
        aucs = [(p["step"], p["kvp_head_auc"]) for p in mine if p["kvp_head_auc"] is not None]
        assert aucs == [(step, e["kvp/head_auc"]) for step, e in rep["evals"]]


def test_plackett_luce_log_probs_sum_to_one_over_every_ranking():
    scores = torch.tensor([[0.5, -1.0, 2.0]])
    orders = torch.tensor(list(itertools.permutations(range(3)))).unsqueeze(1)  # (6, 1, 3)
    probs = plackett_luce_log_prob(scores, orders).exp()
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)
    best = torch.tensor([[[2, 0, 1]]])  # by score: the most likely ranking
    assert float(plackett_luce_log_prob(scores, best).exp()) == pytest.approx(float(probs.max()), abs=1e-7)


def test_rloo_ranks_the_oracle_at_reward_one_and_its_gradient_raises_the_attended_tokens():
    target = torch.tensor([[0.6, 0.3, 0.05, 0.05] * 5]) / 5  # (1, 20), rows sum to 1
    oracle = target.argsort(dim=-1, descending=True).unsqueeze(0)
    assert float(ranking_auc(oracle, target)) == pytest.approx(float(retained_auc(torch.log(target), target)))
    torch.manual_seed(0)
    scores = torch.zeros(1, 20, requires_grad=True)
    rloo_loss(scores, target, samples=256).backward()
    heavy, light = target[0] > 0.1, target[0] < 0.02
    assert float(scores.grad[0][heavy].mean()) < 0 < float(scores.grad[0][light].mean())  # descent raises the heavy


def test_bench_variants_and_policies_name_their_granularity(tmp_path):
    """bench_kvp's ``--variants NAME@head=WEIGHTS`` runs that weights file per (layer, KV head), ``@token`` whole
    tokens; ``--policies kvp@token`` is accepted and an unknown granularity refused in one line."""
    from research.kvp.cli import parse_variants, valid_bench_policy

    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    got = parse_variants(f"a@head={weights},b@token={weights},c={weights},d@head=recent_ratio:0")
    assert got == {
        "a@head": {"weights": str(weights), "granularity": "head"},
        "b@token": {"weights": str(weights), "granularity": "token"},
        "c": {"weights": str(weights)},
        "d@head": {"recent_ratio": 0.0, "granularity": "head"},
    }
    with pytest.raises(ValueError, match="@cols; valid: @token, @head"):
        parse_variants(f"a@cols={weights}")
    assert valid_bench_policy("kvp@token") and valid_bench_policy("kvp@head") and not valid_bench_policy("kvp@cols")
    assert not valid_bench_policy("full@head")
