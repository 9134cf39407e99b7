"""benchmarks.ablation: arbor's variants against its default, paired on the same trees, and the section it writes."""

from __future__ import annotations

import json

import pytest

from benchmarks.ablation import against_default, cost_verdict, facts, main, summarise, summary_rows, verdict
from benchmarks.floor import by_setting
from benchmarks.results.data import load_section


def row(trace: str, policy: str, top1: float, kl: float, rehydrated: int = 0, seconds: float = 1.0) -> dict:
    return {
        "task": "game24", "trace": trace, "policy": policy, "budget_fraction": 0.5, "budget_tokens": 100,
        "top1_agreement": top1, "mean_kl": kl, "rehydrated_tokens": rehydrated, "recomputed_tokens": 0,
        "seconds": seconds, "oom": False, "peak_device_tokens": 100,
    }  # fmt: skip


def replay_rows() -> list[dict]:
    """Four trees: ``arbor:extract=false`` scores what the default scores (more rehydration), ``arbor:pins=``
    loses top-1 on every tree, ``arbor:msve=off`` wins on one tree and loses on another."""
    out = []
    for i, t in enumerate(("a", "b", "c", "d")):
        out += [
            row(t, "arbor", 0.9, 0.1, rehydrated=10),
            row(t, "arbor:extract=false", 0.9, 0.1 + 1e-8, rehydrated=30, seconds=2.0),
            row(t, "arbor:pins=", 0.8 - 0.01 * i, 0.3),
            row(t, "arbor:msve=off", 0.9 + (0.05 if i == 0 else -0.05 if i == 1 else 0.0), 0.1),
            row(t, "random", 0.6, 1.0),
        ]
    return out


def test_each_variant_is_paired_with_the_default_on_the_same_trees():
    paired = {r["policy"]: r for r in against_default(by_setting(replay_rows()))}
    assert set(paired) == {"random", "arbor:extract=false", "arbor:pins=", "arbor:msve=off"}
    assert paired["arbor:extract=false"]["verdict"] == "identical"  # a KL 1e-8 apart is rounding
    assert paired["arbor:extract=false"]["rehydrated_diff"].startswith("20 [20, 20]")
    assert paired["arbor:extract=false"]["seconds_ratio"] == pytest.approx(2.0)
    assert paired["arbor:pins="]["verdict"] == "worse" and paired["arbor:msve=off"]["verdict"] == "no difference"
    assert paired["random"]["verdict"] == "worse"


@pytest.mark.parametrize(
    ("d_top", "d_kl", "want"),
    [
        ([0.0, 0.0], [0.0, 5e-7], "identical"),
        ([0.1, 0.11], [0.0, 0.0], "better"),
        ([0.0, 0.0], [0.2, 0.21], "worse"),
        ([0.1, 0.11], [0.2, 0.21], "mixed"),
        ([0.1], [0.0], "no difference"),  # one tree: no interval, no verdict
    ],
)
def test_verdicts(d_top, d_kl, want):
    assert verdict(d_top, d_kl) == want


def test_facts_count_each_verdict_and_leave_random_out():
    groups = by_setting(replay_rows())
    got = facts(groups, summary_rows(groups), against_default(groups))
    assert (got["settings"], got["identical"], got["worse"], got["no_difference"]) == (3, 1, 1, 1)
    assert got["worse_where"] == "arbor:pins= on game24 at 0.5x" and got["trees"] == "4 game24"
    assert got["default_at_least_as_good"] == 3
    assert got["rehydrates_more"] == 1 and got["rehydrates_more_where"] == "arbor:extract=false on game24 at 0.5x"
    assert got["rehydrates_fewer"] == 2  # pins= and msve=off rehydrated nothing, the default 10 a tree


@pytest.mark.parametrize(
    ("d_reh", "want"),
    [
        ([0, 0, 0], "same"),
        ([10, 12, 11], "more"),
        ([-5, -6, -4], "fewer"),
        ([10, -10, 1], "no difference"),
        ([3], "no difference"),
    ],
)
def test_cost_verdicts(d_reh, want):
    assert cost_verdict(d_reh) == want


def test_the_section_is_written_from_the_replay_files(tmp_path, monkeypatch):
    path = tmp_path / "replay.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in replay_rows()))
    monkeypatch.setattr("benchmarks.results.data.DATA", tmp_path / "data")
    assert main([str(path), "--section", "ablation", "--command", "python scripts/replay_trace.py ..."]) == 0
    data = load_section("ablation", tmp_path / "data")
    assert [r["policy"] for r in data["tables"]["main"]["rows"]][:2] == ["arbor", "random"]
    assert len(data["tables"]["vs_default"]["rows"]) == 4 and data["facts"]["worse"] == 1


def test_rows_under_the_host_tiers_old_switch_name_are_its_variant():
    """Rows replayed at 8642720 say ``arbor:offload=false``; the section counts them as ``host_tier=false``
    (the same switch, renamed before it landed), with the rows that say so already."""
    rows = [row(t, "arbor", 0.9, 0.1) for t in "abcd"]
    rows += [row(t, "arbor:offload=false" if t in "ab" else "arbor:host_tier=false", 0.7, 0.3) for t in "abcd"]
    section = summarise(rows)
    (paired,) = [r for r in section.summary if r["policy"] != "arbor"]
    assert paired["policy"] == "arbor:host_tier=false" and paired["trees"] == 4


def test_the_committed_section_is_recounted_from_its_rows():
    """docs/data/ablation: every table and fact is what summarise makes of the committed per-tree rows."""
    from benchmarks.results.data import DATA, columns_spec

    folder = DATA / "ablation"
    data = json.loads((folder / "results.json").read_text())
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    out = summarise(rows)
    assert (
        out.summary == data["tables"]["main"]["rows"] and columns_spec(out.columns) == data["tables"]["main"]["columns"]
    )
    for name, (_, table) in out.tables.items():
        assert table == data["tables"][name]["rows"]
    assert out.facts == data["facts"]
    trees = {task: len({r["trace"] for r in rows if r["task"] == task}) for task in ("game24", "gsm8k")}
    assert trees == {"game24": 20, "gsm8k": 20}  # the size: at least 20 trees per task
