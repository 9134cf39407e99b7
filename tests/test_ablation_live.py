"""benchmarks/ablation_live.py (issue 65's live ablation): arbor-solve's run dirs of arbor's variants read
back, each variant named by what it changes and paired with the default problem by problem; the
committed section recounted from its rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_e2e_bench import FULL_TREES, job, row, run_dir

from benchmarks.ablation_live import build, main, variant_label

REPO = Path(__file__).resolve().parents[1]
SECTION = REPO / "docs" / "data" / "ablation-live"
BUDGET = ["policy.budget_ratio=0.25", "policy.budget_reference='/x/full'", "policy.reference_may_differ=[]"]


def test_a_variant_is_named_by_the_settings_it_changes_from_the_shipped_policy():
    assert variant_label("arbor", {"policy.msve": "all", "policy.budget_ratio": "0.25"}) == "arbor"
    assert variant_label("arbor", {"policy.msve": "off"}) == "arbor:msve=off"
    assert variant_label("arbor", {"policy.topology": "False"}) == "arbor:topology=false"
    assert variant_label("arbor", {"policy.pins": "[sinks,parent]"}) == "arbor:pins=[sinks,parent]"
    assert variant_label("random", {"policy.budget_reference": "/x"}) == "random"


def fake_runs(tmp_path: Path) -> tuple[Path, Path]:
    """full on 4 problems; arbor's default agrees with full on 3, msve=off on 1, random on 0."""
    answers = ["24", "7", "3", "5"]
    full = run_dir(tmp_path / "full", [row(i, a, i < 2, 1000, 2.0) for i, a in enumerate(answers)], FULL_TREES)
    sweep = tmp_path / "sweep"
    default = [
        row(
            i,
            a if i < 3 else "x",
            i < 2,
            250,
            3.0,
            rehydrated_tokens=10,
            budget_tokens=100,
            floor_tokens=50 + 50 * i,
            forward_calls=10,
        )
        for i, a in enumerate(answers)
    ]  # under the floor on problems 2 and 3
    job(sweep, "a", ["policy=arbor", "policy.msve=all", *BUDGET], default, {})
    off = [
        row(i, a if i == 0 else "y", i == 0, 250, 6.0, recomputed_tokens=4, forward_calls=20)
        for i, a in enumerate(answers)
    ]
    job(sweep, "b", ["policy=arbor", "policy.msve=off", *BUDGET], off, {})
    same = [row(i, a if i < 3 else "x", i < 2, 250, 3.0) for i, a in enumerate(answers)]
    job(sweep, "c", ["policy=arbor", "policy.extract=false", *BUDGET], same, {})
    job(tmp_path / "random", "0", ["policy=random", *BUDGET], [row(i, "z", False, 250, 1.0) for i in range(4)], {})
    return full, sweep


def test_each_variant_is_paired_with_the_default_on_the_same_problems(tmp_path):
    full, sweep = fake_runs(tmp_path)
    out = build(full, [sweep, tmp_path / "random"])
    summary = {r["policy"]: r for r in out["summary"]}
    assert list(summary) == ["full", "arbor", "random", "arbor:extract=false", "arbor:msve=off"]
    assert summary["full"]["agree_n"] == 4 and summary["full"]["budget"] == "none"
    assert summary["arbor"]["agree_n"] == 3 and summary["arbor"]["solved_n"] == 2
    assert summary["arbor"]["rehydrated"] == 10 and summary["arbor:msve=off"]["recomputed"] == 4
    assert summary["arbor"]["below_floor"] == 2 and summary["full"]["nodes_as_full"] == 0.5  # trees of 2 of 4
    paired = {r["policy"]: r for r in out["paired"]}
    off = paired["arbor:msve=off"]
    assert (off["agree_gained"], off["agree_lost"]) == (0, 2) and (off["solved_gained"], off["solved_lost"]) == (0, 1)
    assert off["agree_mean"] == pytest.approx(-0.5) and off["forwards_ratio"] == pytest.approx(2.0)
    assert paired["arbor:extract=false"]["verdict"] == "identical"
    assert off["nodes_as_full_mean"] == 0.0 and off["verdict"] == "no difference"  # 4 problems: wide intervals
    assert paired["random"]["agree_lost"] == 3
    facts = out["facts"]
    assert facts["settings"] == 2 and facts["identical"] == 1 and facts["random_verdict"] == paired["random"]["verdict"]
    assert len(out["rows"]) == 20 and {r["policy"] for r in out["rows"]} == set(summary)


def test_a_run_without_a_budget_ratio_is_refused(tmp_path):
    full, _ = fake_runs(tmp_path)
    job(tmp_path / "bad", "0", ["policy=arbor"], [row(0, "24", True, 1, 1.0)], {})
    with pytest.raises(ValueError, match="budget_ratio"):
        build(full, [tmp_path / "bad"])


def test_bad_paths_are_refused_in_one_line_with_exit_2(tmp_path, capsys):
    full, sweep = fake_runs(tmp_path)
    (tmp_path / "empty").mkdir()
    for argv, said in (
        ([str(tmp_path / "nope"), str(sweep)], "nope: no such folder"),
        ([str(full), str(tmp_path / "nope")], "nope: no such folder"),
        ([str(tmp_path / "empty"), str(sweep)], "no finished problem in its results.jsonl"),
    ):
        with pytest.raises(SystemExit) as err:
            main(argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert err.value.code == 2 and len(lines) == 1 and said in lines[0], (argv, lines)


def test_the_section_is_written_with_its_rows(tmp_path, monkeypatch):
    import benchmarks.results.data as data

    monkeypatch.setattr(data, "DATA", tmp_path / "docs-data")
    full, sweep = fake_runs(tmp_path)
    assert main([str(full), str(sweep), "--section", "ablation-live", "--command", "bash x.sh"]) == 0
    doc = json.loads((tmp_path / "docs-data" / "ablation-live" / "results.json").read_text())
    assert doc["command"] == "bash x.sh" and len(doc["tables"]["vs_default"]["rows"]) == 2
    assert len((tmp_path / "docs-data" / "ablation-live" / "rows.jsonl").read_text().splitlines()) == 16


def test_the_committed_section_recounts_from_its_rows():
    doc = json.loads((SECTION / "results.json").read_text())
    lines = [json.loads(x) for x in (SECTION / "rows.jsonl").read_text().splitlines()]
    by = {}
    for r in lines:
        by.setdefault((r["policy"], r["budget"]), {})[r["index"]] = r
    for row_ in doc["tables"]["main"]["rows"]:
        mine = by[(row_["policy"], row_["budget"])]
        assert len(mine) == row_["problems"] >= 30  # issue 65: n >= 30
        assert sum(r["solved"] for r in mine.values()) == row_["solved_n"]
        assert sum(r["agree"] for r in mine.values()) == row_["agree_n"]
    for pair in doc["tables"]["vs_default"]["rows"]:
        budget = next(b for p, b in by if p == pair["policy"])
        mine, base = by[(pair["policy"], budget)], by[("arbor", budget)]
        for key in ("agree", "solved"):
            assert sum(mine[i][key] and not base[i][key] for i in mine) == pair[f"{key}_gained"]
            assert sum(base[i][key] and not mine[i][key] for i in mine) == pair[f"{key}_lost"]
    # what docs/notes/ablation-live.md says of them: no variant better; the host tier and the question pin missed
    facts = doc["facts"]
    assert facts["better"] == 0 and facts["worse_where"] == "arbor:host_tier=false and arbor:pins=[sinks,parent]"
    assert facts["problems"] == "30" and facts["random_verdict"] == "worse"
