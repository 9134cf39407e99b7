"""benchmarks.results.collect reads a section's other tables and the figures its prose quotes from the
benchmark's outputs (issue 27: no section keeps an older measurement that `make results` can redo):
the KVP section's held-out benchmark (bench_kvp.py) with each context's KL, its replay table, its cost
figures; what stays kept is only what the outputs lack, named by key on the provenance line."""

from __future__ import annotations

import json

import pytest

from benchmarks.results.collect import COLLECTORS, carried, kvp_bench_records, kvp_facts, table_rows
from benchmarks.results.sections import kept_facts


def test_kvp_bench_rows_carry_each_contexts_mean_kl_in_bench_order():
    record = {
        "rows": [{"policy": "kvp", "kept_share": 0.5, "mean_kl": 0.3}, {"policy": "oracle", "kept_share": 0.5}],
        "per_context": [
            {"runs": [{"policy": "kvp", "compression_ratio": 0.5, "kl": [0.1, 0.3]}, {"policy": "oracle",
                                                                                       "compression_ratio": 0.5}]},
            {"runs": [{"policy": "kvp", "compression_ratio": 0.5, "kl": [0.5, 0.5]}]},
        ],
    }  # fmt: skip
    kvp, oracle = kvp_bench_records(record)
    assert kvp["context_mean_kl"] == pytest.approx([0.2, 0.5]) and oracle["context_mean_kl"] is None


def test_kvp_tables_and_figures_come_from_the_benchmarks_outputs(tmp_path):
    bench = {
        "threads": 2, "steps": 32, "seconds": 600.0, "contexts": [{"name": "gsm8k:6:0", "context_tokens": 787}],
        "rows": [{"policy": "kvp", "kept_share": 0.1, "retained": 0.8, "mean_kl": 0.09, "top1": 0.87}],
        "per_context": [{"runs": [{"policy": "kvp", "compression_ratio": 0.9, "kl": [0.09]}]}],
        "cost": {"context": "math500:5:200", "budget_tokens": 812, "kvp_scoring_ms_per_step": 0.2,
                 "kvp_ms_per_step": 90.0, "kvp_tokens_scored_per_step": 1.0, "streaming_ms_per_step": 80.0,
                 "h2o_ms_per_step": 100.0},
    }  # fmt: skip
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    replay = {"task": "gsm8k", "problem": 0, "budget_fraction": 0.7, "policy": "arbor+kvp", "top1_agreement": 1.0}
    (tmp_path / "replay.jsonl").write_text(json.dumps(replay) + "\n")
    tables = dict(COLLECTORS["kvp"].tables)
    (row,) = table_rows(tables["table2"], tmp_path)
    assert row == {"kept": 10.0, "policy": "kvp", "retained_future_attention": 0.8, "mean_kl": 0.09, "top_1": 0.87,
                   "mean_kl_per_context": [0.09]}  # fmt: skip
    (row,) = table_rows(tables["table3"], tmp_path)
    assert row["trace"] == "gsm8k-0" and row["budget"] == 70.0 and row["policy"] == "arbor+kvp"
    facts = kvp_facts(tmp_path)
    assert facts["bench_minutes"] == 10.0 and facts["cost_budget_tokens"] == 812 and facts["step_ms"] == 90.0
    assert facts["bench_contexts"] == "`gsm8k:6:0` (787 tokens)" and facts["cost_context"] == "math500:5:200"
    assert facts["shipped_loss"] == "budgets" and facts["shipped_train_tokens"] > 0  # the shipped weights' record
    assert "train_context_tokens" not in facts  # no training report here


def test_only_what_a_rerun_did_not_measure_is_kept_and_named():
    committed = {
        "measured": "2026-11-30", "commit": "a" * 40, "settings": {"model": "m"},
        "tables": {"main": {}, "table2": {"rows": [1]}, "table3": {"rows": [2]}},
        "facts": {"scoring_ms": 0.2, "kernel_calls_kvp": 13320},
    }  # fmt: skip
    kept = carried(committed, {"model": "m"}, measured=({"table2"}, {"scoring_ms"}))
    assert set(kept["tables"]) == {"table3"} and kept["facts"] == {"kernel_calls_kvp": 13320}
    assert kept["carried"]["tables"] == ["table3"] and kept["carried"]["facts"] == ["kernel_calls_kvp"]
    assert carried(committed, {"model": "m"}, measured=({"table2", "table3"}, set(committed["facts"]))) == {}
    # the provenance line: all the figures, or those by key when others were remeasured
    assert kept_facts(["a", "b"], {"a": 1, "b": 2}) == ["the figures its prose quotes"]
    assert kept_facts(["b"], {"a": 1, "b": 2}) == ["the figures `b`"]
    assert kept_facts([], {"a": 1}) == []


def test_the_budgets_variant_losses_count_the_small_share_cells_where_its_kl_is_higher():
    from benchmarks.results.collect import budgets_losses

    def ctx(kvp: float, budgets: float, ratio: float = 0.9) -> dict:
        return {"runs": [{"policy": "kvp", "compression_ratio": ratio, "kl": [kvp]},
                         {"policy": "kvp-budgets", "compression_ratio": ratio, "kl": [budgets]}]}  # fmt: skip

    bench = {"per_context": [ctx(0.1, 0.2), ctx(0.3, 0.1), ctx(0.1, 0.5, ratio=0.5)]}  # the 50% cell is not counted
    assert budgets_losses(bench) == {"kvp_budgets_losses_10_20": 1, "kvp_budgets_cells_10_20": 2}
    assert budgets_losses({"per_context": [{"runs": [{"policy": "kvp", "compression_ratio": 0.9, "kl": [1]}]}]}) == {}


def test_a_long_training_curve_is_kept_as_evenly_spaced_means():
    from benchmarks.results.collect import kvp_curve_records

    report = {"settings": {"loss": "listnet"}, "losses": [float(i) for i in range(1000)], "evals": [[500, {}]]}
    rows = kvp_curve_records(report)
    points = [r for r in rows if "train_loss" in r]
    assert len(points) == 112 and points[0] == {"loss": "listnet", "step": 9, "train_loss": 4.0}  # steps 0-8
    assert points[-1]["step"] == 1000 and points[-1]["train_loss"] == 999.0  # 999 = 111 x 9: the last step alone
    assert rows[-1] == {"loss": "listnet", "step": 500, "kvp_head_auc": None, "kvp_token_auc": None}
