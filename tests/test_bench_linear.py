"""bench_linear: contexts, the project side's protocol, the kvpress side's whole-token variant, the table."""

from __future__ import annotations

import json

import pytest
import torch

from arbor_runtime import Runtime
from benchmarks import kvpress_side
from benchmarks.linear import (
    DEFAULT_CONTEXTS,
    Context,
    build_context,
    compare,
    comparison,
    context_texts,
    kept_tokens,
    parse_spec,
    prefill,
    project_run,
    reference_continuation,
    run_project,
    summarize,
)
from benchmarks.linear_cli import main
from benchmarks.stats_cost import main as stats_cost_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_default_contexts_are_few_shot_prompts_of_600_to_2000_tokens(tiny, full_data):
    lengths = []
    for spec in DEFAULT_CONTEXTS:
        task, shots, _ = parse_spec(spec)
        context, question = context_texts(full_data, spec)
        assert context.count("Question: ") == shots and question.startswith("\nQuestion: ")
        assert question.endswith("Solution:\n") and "<<" not in context
        lengths.append(len(build_context(tiny.tokenizer, full_data, spec).context_ids))
    assert all(600 <= n <= 2000 for n in lengths), lengths
    assert {parse_spec(s)[0] for s in DEFAULT_CONTEXTS} == {"gsm8k", "math500"}


def test_bad_context_specs_are_refused(data_dir):
    with pytest.raises(ValueError, match="context spec 'gsm8k:x:1' is not TASK:SHOTS:QUESTION"):
        parse_spec("gsm8k:x:1")
    with pytest.raises(ValueError, match=r"'gsm8k:2:99999': gsm8k has \d+ train and \d+ test rows"):
        context_texts(data_dir, "gsm8k:2:99999")


def test_kept_tokens_count_as_kvpress_does():
    # kvpress: int(k_len * (1 - compression_ratio)); 1 - 0.9 is 0.0999..., so 628 tokens keep 62
    assert [kept_tokens(628, r) for r in (0.5, 0.75, 0.9)] == [314, 157, 62]


def test_project_protocol_compresses_once_then_teacher_forces(tiny):
    ids = torch.randint(3, 5000, (120,), generator=torch.Generator().manual_seed(0)).tolist()
    ctx = Context("synthetic", ids, [11, 12, 13])
    base = prefill(tiny, ctx, "full")
    reference_continuation(base, ctx, steps=6)
    assert len(ctx.continuation_ids) == 6
    full = project_run(base, ctx, None)
    assert full.logp.shape == (6, tiny.model.config.vocab_size) and full.kept_tokens == 120
    assert full.logp.argmax(-1).tolist() == ctx.continuation_ids  # step j predicts continuation token j
    assert len(base.rt.nodes) == 1  # the forks left the prefilled runtime as it was
    run = project_run(prefill(tiny, ctx, "streaming"), ctx, 0.75)
    assert run.kept_tokens == 30
    kl, top1 = compare(full.logp, run.logp)
    assert len(kl) == 6 and min(kl) >= 0 and max(kl) > 1e-3
    assert compare(full.logp, full.logp)[0] == [0.0] * 6
    (ctx_out,) = run_project(tiny, [Context("again", ids, [11, 12, 13])], ["streaming"], [0.75], steps=6)
    (row,) = ctx_out["runs"]
    assert row["kl"] == pytest.approx(kl, abs=1e-5) and row["kept_tokens"] == 30
    assert set(ctx_out["prefill_seconds"]) == {"full", "streaming"}


@pytest.mark.parametrize("policy", ["h2o", "snapkv"])
def test_a_forked_prefill_compresses_exactly_as_a_fresh_one(tiny, policy):
    ids = torch.randint(3, 5000, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    ctx = Context("synthetic", ids, [11, 12], [13, 14, 15])
    pre = prefill(tiny, ctx, policy)
    first, second = project_run(pre, ctx, 0.5), project_run(pre, ctx, 0.5)
    rt = Runtime(tiny, policy)
    blocks = {}
    rt.logits_hook = lambda node, logp: blocks.__setitem__(node.id, logp)
    root = rt.new_tree_ids(ids)
    rt.compress(75)
    fresh = blocks[rt.append_ids(root, [11, 12, 13, 14, 15]).id][2:]
    assert torch.equal(first.logp, fresh) and torch.equal(second.logp, fresh)


def test_whole_token_variant_keeps_one_token_set_for_every_layer_and_head():
    torch.manual_seed(0)
    layers = [(torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)) for _ in range(3)]
    scores = [torch.zeros(1, 10) for _ in range(3)]
    scores[0][0, [1, 7]] = 3.0  # layer 0 likes 1 and 7, layer 2 likes 4: the mean ranks 1, 7 > 4 > the rest
    scores[2][0, 4] = 5.0
    out = kvpress_side.whole_tokens(layers, scores, ratio=0.7)
    for (keys, values), (k_in, v_in) in zip(out, layers, strict=True):
        assert keys.shape == (1, 2, 3, 4)
        assert torch.equal(keys, k_in[:, :, [1, 4, 7]]) and torch.equal(values, v_in[:, :, [1, 4, 7]])
    ref = torch.log_softmax(torch.randn(4, 9), -1)
    kl, top1 = kvpress_side.compare(ref, ref)
    assert kl == [0.0] * 4 and top1 == [True] * 4


def run_of(method_key: str, method: str, ratio: float, kl: list[float]) -> dict:
    key = "policy" if method_key == "project" else "press"
    return {key: method, "compression_ratio": ratio, "kl": kl, "top1": [True, False]}


def test_table_pairs_each_policy_with_its_press_in_both_variants():
    project = [{"runs": [run_of("project", "h2o", 0.5, [0.2, 0.4]), run_of("project", "thinkv", 0.5, [1.0, 1.0])]}]
    head = run_of("kvpress", "observed_attention", 0.5, [0.1, 0.1]) | {"variant": "per_head"}
    token = run_of("kvpress", "observed_attention", 0.5, [0.3, 0.3]) | {"variant": "token"}
    rows = summarize(project, {"items": [{"runs": [head, token]}]})
    assert {(r["side"], r["method"]) for r in rows} == {
        ("project", "h2o"),
        ("project", "thinkv"),
        ("kvpress/per_head", "observed_attention"),
        ("kvpress/token", "observed_attention"),
    }
    (row,) = comparison(rows)  # thinkv has no counterpart
    assert row["policy"] == "h2o" and row["kept_share"] == 0.5
    assert row["kl"] == pytest.approx(0.3) and row["top1"] == 0.5
    assert row["ratio_vs_press"] == pytest.approx(3.0) and row["ratio_vs_token"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shares", "0.5,1.5"], "--shares '0.5,1.5': every kept share must be in (0, 1)"),
        (["--policies", "h2o,lru"], "--policies 'h2o,lru': unknown ['lru']; valid:"),
        (["--presses", "tova"], "--presses 'tova': unknown ['tova']; valid: streaming, observed_attention"),
        (["--kvpress-venv", "/nonexistent/kv"], "--kvpress-venv /nonexistent/kv has no bin/python; pass --create-venv"),
        (["--steps", "0"], "--steps=0 must be >= 1"),
    ],
)
def test_bad_arguments_end_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench_linear.py: error: {message}") and err.count("\n") == 1


def test_stats_cost_script_measures_every_policy_against_full(tmp_path, data_dir, capsys):
    out = tmp_path / "cost.json"
    argv = ["--model", "tiny-random", "--context", "gsm8k:1:0", "--repeats", "1", "--rows", "2", "--new-tokens", "3"]
    assert stats_cost_main([*argv, "--data-dir", str(data_dir), "--out", str(out), "--threads", "1"]) == 0
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"full", "h2o", "snapkv"} and data["policies"]["full"]["prefill_vs_full"] == 1.0
    assert all(m["prefill_ms_per_token"] > 0 and m["expand_ms_per_token"] > 0 for m in data["policies"].values())
    assert stats_cost_main(["--repeats", "0"]) == 2
    assert "--repeats/--rows/--new-tokens 0/4/16: each must be >= 1" in capsys.readouterr().err


def _linear_json(tmp_path) -> dict:
    """A bench_linear.py JSON on one context: h2o / snapkv / thinkv next to three presses in both variants."""
    ratios = (0.5, 0.75, 0.9)
    project = [
        run_of("project", p, r, [0.2 * (i + 1), 0.4]) for p in ("h2o", "snapkv", "thinkv") for i, r in enumerate(ratios)
    ]
    presses = [
        run_of("kvpress", press, r, kl) | {"variant": variant}
        for press in ("observed_attention", "snapkv", "knorm")
        for r in ratios
        for variant, kl in (("per_head", [0.1, 0.1]), ("token", [0.2, 0.2]))
    ]
    rows = summarize([{"runs": project}], {"items": [{"runs": presses}]})
    checks = [{"max_abs_token_logp_diff": 2e-5, "fan_out_check": {"press": "snapkv", "compression_ratio": 0.5,
                                                                    "max_abs_logp_diff": 0.0}}]  # fmt: skip
    return {
        "command": "python scripts/bench_linear.py", "threads": 1, "steps": 2, "rows": rows,
        "comparison": comparison(rows), "contexts": [{"name": "math500:5:200", "context_tokens": 40}],
        "seconds": {"project": 90.0, "kvpress": 30.0}, "checks": checks,
        "prefill_cost": {"streaming": {"vs_full": 0.9}},
        "kvpress_versions": {"kvpress": "0.5.5", "transformers": "5.2.0", "torch": "2.13.0+cpu"},
    }  # fmt: skip


def test_bench_linear_output_becomes_the_linear_section(tmp_path):
    """bench_linear's linear.json -> docs/data/linear (benchmarks.results.collect) -> the section through its
    template: the comparison table, every method at every share (table2) and the figures the prose quotes
    come from the JSON; bench_stats_cost.py's table (table3) is kept from the committed data until its JSON
    is beside it. A second collect replaces what the first wrote."""
    from benchmarks.results.collect import write as collect
    from benchmarks.results.data import load_section
    from benchmarks.results.sections import Section, render_section

    (tmp_path / "linear").mkdir()
    (tmp_path / "linear" / "linear.json").write_text(json.dumps(_linear_json(tmp_path)))
    for _ in range(2):  # written the first time, replaced the second
        collect("linear", tmp_path / "linear", "python scripts/bench_linear.py", data_root=tmp_path / "data")
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["linear"]  # no other section is touched
    data = load_section("linear", tmp_path / "data")
    assert len(data["tables"]["main"]["rows"]) == 6 and len(data["tables"]["table2"]["rows"]) == 27
    assert data["carried"]["tables"] == ["table3"]
    assert data["facts"]["max_logp_diff_uncompressed"] == 2e-5 and data["facts"]["project_minutes"] == 1.5
    assert data["facts"]["h2o_math500_kl_50"] == pytest.approx(0.3)  # h2o at 50% kept on that context
    assert data["settings"]["continuation_tokens"] == 2 and data["settings"]["contexts"] == {"math500:5:200": 40}
    text = render_section(Section("linear"), data)
    assert text.startswith("## Linear baselines next to kvpress (compress once, then teacher-force)\n")
    assert "| h2o | observed_attention | 50% | 0.3 | 0.1 | 0.2 | 3.00× | 1.50× | 0.5 | 0.5 | 0.5 |" in text
    assert "ObservedAttentionPress**: 4.00× at 25% and 5.00× at 10%, but 3.00× at 50%" in text  # the prose follows
    assert "| kvpress | knorm (token) | 50% | 0.2 |" in text and "(0.300 / 0.400 / 0.500 at 50 / 25 / 10%" in text
    assert "Kept from the measurement of" in text and "table `table3`" in text
    # bench_stats_cost.py's JSON beside it: table3 and its figures are this run's too
    cost = {"context": "gsm8k:10:1", "context_tokens": 1731, "rows": 4, "new_tokens": 16, "repeats": 5, "threads": 1}
    cost["policies"] = {p: {"prefill_ms_per_token": 3.0 * x, "prefill_vs_full": x, "prefill_wall_vs_full": x,
                            "expand_ms_per_token": 30.0, "expand_vs_full": 1.0, "expand_wall_vs_full": 1.0}
                        for p, x in (("full", 1.0), ("h2o", 1.5), ("snapkv", 1.0))}  # fmt: skip
    (tmp_path / "linear" / "stats_cost.json").write_text(json.dumps(cost))
    collect("linear", tmp_path / "linear", "python scripts/bench_linear.py", data_root=tmp_path / "data")
    data = load_section("linear", tmp_path / "data")
    assert [r["policy"] for r in data["tables"]["table3"]["rows"]] == ["full", "h2o", "snapkv"]
    assert "table3" not in data.get("carried", {}).get("tables", [])
    text = render_section(Section("linear"), data)
    assert "takes 1.50× full's prefill\n  time at 1,731 tokens" in text and "medians of 5 interleaved runs" in text
