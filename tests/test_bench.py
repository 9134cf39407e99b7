"""Benchmarks: memory-over-steps plot (series and PNG), speed vs naive ToT (same log-probs, token counts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.synthetic import synthetic_search
from floats import reassociation_tol

from benchmarks.cli import plot_main, record_main, speed_main
from benchmarks.plots import memory_panels, plot_memory
from benchmarks.replay import budgets_for
from benchmarks.speed import BUILDERS, expected_prefill_tokens, max_logprob_diff, speed_compare
from benchmarks.trace import record_trace

REPO = Path(__file__).resolve().parents[1]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trace(tiny):
    return record_trace(tiny, synthetic_search, meta={"task": "synthetic"})


def runtime_calls(trace) -> int:
    return sum(op.op != "set_value" for op in trace.replay_ops())


def test_memory_plot_has_the_expected_series(tiny, trace, tmp_path):
    budgets = [(b, f) for f, b in budgets_for(trace, [0.6, 0.9]).items()]
    panels = plot_memory(memory_panels(tiny, trace, ["full", "h2o", "arbor"], budgets), tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG_MAGIC
    assert [(p["budget_tokens"], p["fraction"]) for p in panels] == budgets
    steps = runtime_calls(trace)
    for panel in panels:
        series = panel["series"]
        assert list(series) == ["full", "h2o", "arbor"]
        full = series["full"]
        assert full["budget_tokens"] is None and max(full["resident_tokens"]) > panel["budget_tokens"]
        switches = series["full"]["branch_switch_steps"]
        assert switches and all(s["branch_switch_steps"] == switches for s in series.values())
        for name in ("h2o", "arbor"):
            s = series[name]
            assert s["oom_step"] is None and s["step"] == list(range(steps))
            assert max(s["peak_tokens"]) <= panel["budget_tokens"]
            assert len(s["resident_tokens"]) == len(s["host_tokens"]) == steps
        assert series["h2o"]["rehydration_steps"] == [] and max(series["h2o"]["host_tokens"]) == 0
    low = panels[0]["series"]["arbor"]
    assert low["rehydration_steps"] and max(low["host_tokens"]) > 0


def test_plot_script_end_to_end_one_problem_two_policies_two_budgets(tiny, data_dir, tmp_path):
    overrides = ["model=tiny-random", f"paths.data_dir={data_dir}", "task.end=901", "task.n_shots=1"]
    assert record_main(["--out", str(tmp_path), *overrides, "controller.n_generate=2"]) == 0
    png = tmp_path / "memory.png"
    argv = [str(tmp_path / "game24-900.json"), "--policies", "h2o,arbor", "--budget-tokens", "150,190"]
    assert plot_main([*argv, "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    data = json.loads(png.with_suffix(".json").read_text())
    assert [p["budget_tokens"] for p in data["panels"]] == [150, 190]
    assert all(list(p["series"]) == ["h2o", "arbor"] for p in data["panels"])
    assert all(s["step"] for p in data["panels"] for s in p["series"].values())


def test_three_builds_compute_the_same_logprobs_and_expected_tokens(tiny, trace):
    builds = {name: build(tiny, trace) for name, build in BUILDERS.items()}
    expected = expected_prefill_tokens(trace)
    assert {name: b.prefill_tokens for name, b in builds.items()} == expected
    assert expected["naive"] > 4 * expected["runtime"] and expected["prefix_cache"] > expected["runtime"]
    scored = {n.id for n in trace.nodes.values() if n.parent is not None}
    assert all(b.logprobs.keys() == scored for b in builds.values())
    # three forwards over the same tokens in different shapes (whole path, cached prefix, tree blocks):
    # equal up to the rounding of a different summation order
    tol = reassociation_tol(tiny, [x for k in scored for x in trace.nodes[k].logprobs])
    assert max_logprob_diff(builds["runtime"], builds["naive"]) <= tol
    assert max_logprob_diff(builds["runtime"], builds["prefix_cache"]) <= tol
    naive = builds["naive"].logprobs
    recorded = max(abs(a - b) for k in scored for a, b in zip(naive[k], trace.nodes[k].logprobs, strict=True))
    assert recorded <= tol


def test_speed_summary_and_script(tiny, trace, tmp_path):
    summary = speed_compare(tiny, trace, repeats=2, warmup=0)
    assert set(summary["methods"]) == {"runtime", "naive", "prefix_cache"}
    assert all(len(m["seconds"]) == 2 for m in summary["methods"].values())
    assert set(summary["ratios"]) == {"runtime/naive", "runtime/prefix_cache"}
    assert summary["ratios"]["runtime/naive"]["prefill_tokens"] < 0.25
    assert 0.0 <= summary["runtime_overhead"]["fraction"] <= 1.0
    path = trace.save(tmp_path / "t.json")
    assert speed_main([str(path), "--repeats", "1", "--warmup", "0", "--out", str(tmp_path / "speed.json")]) == 0
    out = json.loads((tmp_path / "speed.json").read_text())
    assert out[0]["methods"]["naive"]["prefill_tokens"] == expected_prefill_tokens(trace)["naive"]
    assert speed_main([str(path), "--repeats", "0"]) == 2


def test_speed_and_replay_outputs_become_their_sections(tiny, trace, tmp_path):
    """bench_speed.py's JSON and replay_trace.py's replay.jsonl -> docs/data/{speed,replay}
    (benchmarks.results.collect) -> each section through its template: a row per method / per policy
    and budget, named by the trace, with the figures the benchmark measured; no stale line."""
    from benchmarks.cli import replay_main
    from benchmarks.results.collect import write as collect
    from benchmarks.results.data import load_section
    from benchmarks.results.sections import Section, render_section

    path = trace.save(tmp_path / "t.json")
    speed_out = tmp_path / "speed" / "speed.json"
    assert speed_main([str(path), "--repeats", "1", "--warmup", "0", "--out", str(speed_out)]) == 0
    argv = [str(path), "--policies", "full,h2o", "--fractions", "0.5", "--out", str(tmp_path / "replay")]
    assert replay_main(argv) == 0
    data = tmp_path / "data"
    collect("speed", tmp_path / "speed", "python scripts/bench_speed.py t.json", data_root=data)
    collect("replay", tmp_path / "replay", "python scripts/replay_trace.py t.json", data_root=data)
    speed, replay = load_section("speed", data), load_section("replay", data)
    measured = json.loads(speed_out.read_text())[0]
    rows = {r["method"]: r for r in speed["tables"]["main"]["rows"]}
    assert set(rows) == {"runtime", "naive", "prefix_cache"}
    assert {r["trace"] for r in rows.values()} == {"synthetic #None"}  # the synthetic trace has no row index
    assert rows["naive"]["prefill_tokens"] == measured["methods"]["naive"]["prefill_tokens"]
    assert rows["naive"]["runtime_method_time"] == measured["ratios"]["runtime/naive"]["seconds"]
    assert rows["runtime"]["runtime_overhead"] == 100 * measured["runtime_overhead"]["fraction"]
    policies = [(r["policy"], r["budget_x_full_peak"]) for r in replay["tables"]["main"]["rows"]]
    assert sorted(policies) == [("full", 0.5), ("full", 1.0), ("h2o", 0.5)]
    full = next(r for r in replay["tables"]["main"]["rows"] if r["budget_x_full_peak"] == 1.0)
    assert full["top_1_agree"] is None and full["oom"] == "no" and full["trace"] == "synthetic-None"  # the reference
    for name, section in (("speed", speed), ("replay", replay)):
        text = render_section(Section(name), section)
        assert "Not current" not in text and "| synthetic" in text


def test_bench_memory_output_becomes_the_wide_section(tmp_path):
    """scripts/bench_memory.py on the tiny model -> docs/data/wide (benchmarks.results.collect): the `after`
    columns are this run's, the `before` ones (the commit before issue 8, not rerun) are kept from the
    committed row of the same policy and rows, and the section's provenance says they are kept."""
    from benchmarks.results.collect import write as collect
    from benchmarks.results.data import load_section
    from benchmarks.results.sections import Section, provenance, render_section

    out = tmp_path / "wide" / "after.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_memory.py"), "--model", "tiny-random", "--prefix", "40",
           "--new-tokens", "4", "--rows", "1,32", "--policies", "full,h2o", "--repeats", "1", "--threads", "1",
           "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
    measured = {(r["policy"], r["rows"]): r for r in json.loads(out.read_text())}
    collect("wide", tmp_path / "wide", "python scripts/bench_memory.py", data_root=tmp_path / "data")
    data = load_section("wide", tmp_path / "data")
    committed = {(r["policy"], r["rows"]): r for r in load_section("wide")["tables"]["main"]["rows"]}
    rows = data["tables"]["main"]["rows"]
    assert [(r["policy"], r["rows"]) for r in rows] == [("full", 1), ("full", 32), ("h2o", 1), ("h2o", 32)]
    for r in rows:  # the rows the section's prose quotes (32 over 1, h2o over full)
        key = (r["policy"], r["rows"])
        assert r["peak_alloc_mb_after"] == measured[key]["peak_alloc_mb"]
        assert r["decode_tok_s_after"] == measured[key]["decode_tokens_per_s"]
        assert r["peak_alloc_mb_before"] == committed[key]["peak_alloc_mb_before"]
    assert data["carried"]["columns"] == ["peak_alloc_tree_kv_before", "peak_alloc_mb_before", "decode_tok_s_before"]
    text = render_section(Section("wide"), data)
    assert "not rerun: column `peak_alloc_tree_kv_before`" in text and "Not current" not in text

    # the run measured the older checkout too (make results' wide step): its rows fill the before columns
    before = [r | {"peak_alloc_mb": 10 * r["peak_alloc_mb"], "decode_tokens_per_s": 1.5} for r in measured.values()]
    (tmp_path / "wide" / "before.json").write_text(json.dumps(before))
    (tmp_path / "wide" / "before-commit.txt").write_text("a7d4a38aed66e8e10ec9dea944383577ea10284e\n")
    collect("wide", tmp_path / "wide", "python scripts/bench_memory.py", data_root=tmp_path / "data")
    data = load_section("wide", tmp_path / "data")
    for r in data["tables"]["main"]["rows"]:
        key = (r["policy"], r["rows"])
        assert r["peak_alloc_mb_before"] == 10 * measured[key]["peak_alloc_mb"] and r["decode_tok_s_before"] == 1.5
        assert r["peak_alloc_mb_after"] == measured[key]["peak_alloc_mb"]
    assert not data.get("carried", {}).get("columns") and data["settings"]["before_commit"].startswith("a7d4a38")
    assert "not rerun" not in provenance(data)


def _rehydrate_row(problem, config, name, pool, match, status="ok"):
    """A line of bench_rehydrate.py's rehydrate.jsonl."""
    ran = status == "ok"
    return {"problem": problem, "config": config, "pool_name": name, "pool": pool, "status": status,
            "match": match if ran else None, "prefix": 10.0 * match if ran else None,
            "rehydrated": 100 if ran else None, "host_at_return": 300 if ran else None,
            "peak_device": pool or 1888 if ran else None, "return_s": 6.04 if ran else None}  # fmt: skip


def test_bench_rehydrate_rows_become_the_rehydrate_section(tmp_path):
    """bench_rehydrate.py's rows -> docs/data/rehydrate (--section): a row per configuration and pool with
    means over the trees that ran, the per-tree ranked-vs-position count the prose quotes, and the first
    version's figures (not measured any more) kept and named as kept; the template renders it."""
    from argparse import Namespace

    from benchmarks.rehydrate import section_facts, section_rows, write_section
    from benchmarks.results.data import load_section
    from benchmarks.results.sections import Section, render_section

    rows = []
    for p in range(3):
        rows += [_rehydrate_row(p, "full", "-", None, 1.0), _rehydrate_row(p, "lychee", "-", None, 0.5)]
        rows.append(_rehydrate_row(p, "whole", "hi", 1616, 0.5))
        for name, pool in (("mid", 1520), ("lo", 1480)):
            rows.append(_rehydrate_row(p, "whole", name, pool, 0.5, "ok" if name == "mid" else "OOM (1500 needed)"))
            rows.append(_rehydrate_row(p, "ranked", name, pool, 0.4 + 0.1 * p))
            rows.append(_rehydrate_row(p, "position", name, pool, 0.5))
            rows.append(_rehydrate_row(p, "none", name, pool, 0.1))
    table = section_rows(rows)
    assert [(r["configuration"], r["pool_tokens"]) for r in table][:4] == [
        ("full", None), ("lychee", None), ("whole", "hi (1616)"), ("whole", "mid (1520)")]  # fmt: skip
    lo_whole = next(r for r in table if r["configuration"] == "whole" and r["pool_tokens"] == "lo (1480)")
    assert lo_whole["ran"] == "0/3" and lo_whole["tokens_full"] is None
    ranked_mid = next(r for r in table if r["configuration"] == "ranked" and r["pool_tokens"] == "mid (1520)")
    assert ranked_mid["tokens_full"] == 0.5 and ranked_mid["ran"] == "3/3" and ranked_mid["return_s"] == 6.0
    facts = section_facts(rows)  # ranked 0.4 / 0.5 / 0.6 against position's 0.5, at two pools
    assert facts == {"ranked_beats_position_pairs": 2, "tree_pool_pairs": 6, "tree2_mid_ranked": 0.6,
                     "tree2_mid_position": 0.5}  # fmt: skip
    args = Namespace(model="smollm2", root=1024, branch_a=448, branch_b=192, answer=32, rows=4, problems=3)
    write_section(rows, args, "python scripts/bench_rehydrate.py --section", root=tmp_path)
    data = load_section("rehydrate", tmp_path)
    assert data["facts"]["no_probe_ranked_mid"] == load_section("rehydrate")["facts"]["no_probe_ranked_mid"]
    assert data["carried"]["facts"] == ["no_probe_ranked_mid", "no_probe_ranked_lo"]
    text = render_section(Section("rehydrate"), data)
    assert "3 trees" in text  # only the no-probe figures are older: the provenance line names them
    assert "not rerun: the figures `no_probe_ranked_mid`, `no_probe_ranked_lo`." in text


def test_replay_takes_policy_variants_and_names_each_in_its_rows(tiny, trace, tmp_path, capsys):
    """``--policies arbor,arbor:host_tier=false``: one run each, the variant named as given; a variant that
    names no field, or a value its policy refuses, is one line before any replay."""
    from benchmarks.cli import replay_main

    path = trace.save(tmp_path / "t.json")
    peak = budgets_for(trace, [0.3])[0.3]
    argv = [str(path), "--policies", "arbor,arbor:host_tier=false:pins=", "--fractions", "0.3", "--together"]
    assert replay_main([*argv, "--out", str(tmp_path / "r")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "r" / "replay.jsonl").read_text().splitlines()]
    runs = {r["policy"]: r for r in rows if r["budget_fraction"] == 0.3}
    assert set(runs) == {"arbor", "arbor:host_tier=false:pins="} and all(
        r["budget_tokens"] == peak for r in runs.values()
    )
    assert runs["arbor:host_tier=false:pins="]["peak_host_tokens"] == 0 and runs["arbor"]["peak_host_tokens"] > 0
    capsys.readouterr()  # what the replay printed (and any logging of earlier tests' handlers): not this check's
    for spec, message in (
        ("arbor:msve=loud", "msve='loud'; valid: all, off"),
        ("arbor:colour=red", "'colour=red' is not"),
    ):
        assert replay_main([str(path), "--policies", spec, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("replay_trace.py: error:") and message in err and "\n" not in err
    assert not (tmp_path / "bad").exists()
