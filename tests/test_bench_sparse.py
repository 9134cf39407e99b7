"""bench_sparse.py on the tiny model: contexts of exact length, the measurements, the files, the results section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.sparse import SparseSettings, fewshot_ids, prefilled, synthetic_kv
from benchmarks.sparse_cli import main


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def long_data(tmp_path_factory) -> Path:
    """GSM8K and MATH-500 files with enough rows for a few hundred tokens of shots."""
    root = tmp_path_factory.mktemp("data")
    for folder, names, fields in (
        ("gsm8k", ("train.jsonl", "test.jsonl"), ("question", "answer")),
        ("math500", ("test.jsonl",), ("problem", "solution")),
    ):
        (root / folder).mkdir()
        rows = [
            {fields[0]: f"What is {i} plus {i + 1}?", fields[1]: f"{i} + {i + 1} = {2 * i + 1}."} for i in range(60)
        ]
        for name in names:
            (root / folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_fewshot_context_has_the_exact_length_and_ends_with_the_question(tiny, long_data):
    for source in ("gsm8k", "math500"):
        ids = fewshot_ids(tiny.tokenizer, long_data, source, 300)
        assert len(ids) == 300
        assert tiny.tokenizer.decode(ids).endswith("Question: What is 0 plus 1?\nAnswer:")
    with pytest.raises(ValueError, match="not enough rows for a 100000-token context"):
        fewshot_ids(tiny.tokenizer, long_data, "gsm8k", 100_000)
    with pytest.raises(ValueError, match="unknown few-shot source 'aime'; valid: gsm8k, math500"):
        fewshot_ids(tiny.tokenizer, long_data, "aime", 300)
    with pytest.raises(ValueError, match="unknown method 'flash'"):
        SparseSettings().policy("flash")


def test_synthetic_prefill_writes_the_synthetic_kv_into_the_pool(tiny):
    rt, root, _ = prefilled(tiny, list(range(100, 400)), synthetic=True)
    keys, values = rt.store.read(root.id)  # (L, H, T, D)
    shape = rt.backend.shape
    want = list(synthetic_kv(shape.layers, shape.kv_heads, 300, shape.head_dim, 0))
    assert torch.equal(keys, torch.cat([k for k, _ in want]).to(keys.dtype))
    assert torch.equal(values, torch.cat([v for _, v in want]).to(values.dtype))
    assert rt.backend.forward_calls == 0 and "forward" not in vars(rt.backend)  # the model never ran


def run_bench(tmp_path, data, *extra) -> list[dict]:
    out = tmp_path / "sparse"
    argv = ["--data-dir", str(data), "--model", "tiny-random", "--contexts", "256", "--random-contexts", ""]
    assert main([*argv, "--decode", "4", "--fidelity-steps", "3", "--out", str(out), *extra]) == 0
    rows = [json.loads(x) for x in (out / "sparse.jsonl").read_text().splitlines()]
    assert (out / "sparse.csv").read_text().splitlines()[0].startswith("model,context,method,decode_tok_s")
    return rows


def test_reading_every_token_is_dense_and_a_small_budget_reads_less(tmp_path, long_data):
    rows = run_bench(tmp_path, long_data, "--token-budget", "100000")
    assert [r["method"] for r in rows] == ["dense", "lychee", "quest"]
    for r in rows[1:]:
        assert r["read_fraction"] == 1.0 and r["top1_gsm8k"] == 1.0 and r["top1_math500"] == 1.0
        assert r["kl_gsm8k"] < 1e-5 and r["kl_math500"] < 1e-5
        assert r["index_ms_step"] > 0 and r["sparse_attn_ms_step"] > 0 and r["build_s"] > 0
        assert 0 < r["index_pct"] < 5
    assert rows[0]["speedup"] == 1.0 and rows[0]["index_ms_step"] is None
    small = run_bench(tmp_path, long_data, "--token-budget", "64", "--methods", "lychee")
    assert small[0]["read_fraction"] < 0.5 and "speedup" not in small[0]  # no dense row to compare with


def test_lychee_fp16_stores_the_same_chunks_in_float16(tmp_path, long_data):
    """The float16-vs-int8 table's variant: the same chunks (same reads) with float16 centroids, so its
    index is larger than lychee's int8 one (codes plus a scale per node) and smaller than twice it."""
    rows = run_bench(tmp_path, long_data, "--token-budget", "64", "--methods", "lychee,lychee-fp16")
    int8, fp16 = rows
    assert (int8["method"], fp16["method"]) == ("lychee", "lychee-fp16")
    assert int8["read_fraction"] == fp16["read_fraction"] < 1.0
    assert int8["index_mb"] < fp16["index_mb"] < 2 * int8["index_mb"]


def test_bad_arguments_are_errors(tmp_path, long_data, capsys):
    assert main(["--methods", "lychee,flash", "--data-dir", str(long_data)]) == 2
    err = capsys.readouterr().err
    assert "--methods 'lychee,flash': unknown ['flash']; valid: dense, lychee, quest, lychee-fp16" in err
    assert main(["--contexts", "32", "--data-dir", str(long_data)]) == 2
    assert "every context must be >= 64 tokens" in capsys.readouterr().err


def test_bench_sparse_output_becomes_the_sparse_section(tmp_path, long_data):
    """bench_sparse's sparse.jsonl -> docs/data/sparse (benchmarks.results.collect) -> the section through its
    template: the tiny model's rows as the benchmark wrote them, next to the committed contexts the prose
    quotes (under the benchmark's keys), one of them at new figures that the table and the prose show."""
    from benchmarks.results.collect import COLLECTORS
    from benchmarks.results.collect import write as collect
    from benchmarks.results.data import load_section
    from benchmarks.results.sections import Section, render_section

    tiny = run_bench(tmp_path, long_data)  # dense, lychee, quest at 256 tokens
    keys = COLLECTORS["sparse"].keys  # section column key -> bench_sparse key
    assert set(keys.values()) <= {k for row in tiny for k in row}  # the collector reads what the benchmark writes
    committed = [{b: r[k] for k, b in keys.items()} for r in load_section("sparse")["tables"]["main"]["rows"]]
    for row in committed:
        row["read_fraction"] /= 100
        if (row["context"], row["method"]) == (8192, "lychee"):
            row |= {"model": "smollm2", "decode_tok_s": 4.0, "speedup": 1.5, "attn_ms_step": 50.0, "attn_speedup": 2.0}
            row |= {"read_fraction": 0.13, "index_pct": 1.9, "top1_gsm8k": 0.95}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "sparse.jsonl").write_text("".join(json.dumps(r) + "\n" for r in committed + tiny))
    collect("sparse", tmp_path / "bench", "python scripts/bench_sparse.py", data_root=tmp_path / "data")
    text = render_section(Section("sparse"), load_section("sparse", tmp_path / "data"))
    assert text.startswith("## Sparse decode attention: LycheeCluster and Quest vs dense, by context length\n")
    assert "| smollm2 | 8,192 | lychee | 4 | 1.5 | 50 | 2 |" in text and "| 13.0% | 1.90% | 0.95 |" in text
    assert "decodes at **1.50x dense** (attention 2.00x" in text  # the prose follows the new row
    lychee = next(r for r in tiny if r["method"] == "lychee")
    assert f"| {lychee['model']} | 256 | lychee |" in text and f"| {lychee['read_fraction'] * 100:.1f}% |" in text


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        ("lychee:rerank=0.5", "rerank=0.5 must be 0 (off) or a number in [1, 64]"),
        ("lychee:max_chunks=4", "max_chunks"),
        ("dense", "'dense'; valid: lychee or quest"),
    ],
)
def test_the_step_profile_refuses_a_bad_method_before_building_the_model(tmp_path, capsys, methods, message):
    from benchmarks.sparse_profile import main as profile

    with pytest.raises(SystemExit) as exited:
        profile(["--methods", methods, "--out", str(tmp_path / "rows.jsonl")])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err and not (tmp_path / "rows.jsonl").exists()
