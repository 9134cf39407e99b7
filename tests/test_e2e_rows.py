"""Every total of an end-to-end section recounts from its committed per-problem rows (issue 63).

An end-to-end section (``docs/data/e2e-*``, written by ``benchmarks/e2e.py``) commits ``rows.jsonl`` beside
``results.json``: one line per problem of each table row (its answer, solved, agreement with full, seconds,
peaks, pool, OOM, budget and floor). Here each table row's counts, rates' numerators, p50 / p95 seconds,
means and gained / lost against full are recounted from those lines, by a count written out here, not by the
benchmark's own code. Sections measured before the rows were recorded are listed in :data:`WITHOUT_ROWS`
with the command that adds them; the list may only shrink.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "data"
SECTIONS = sorted(p.name for p in DATA.glob("e2e-*") if (p / "results.json").is_file())
#: sections whose rows were not kept when they were measured (their run dirs are gone): rerun them with the
#: command in their results.json (scripts/bench_e2e.sh or scripts/bench_scaling.sh) to add their rows
WITHOUT_ROWS = {
    "e2e-lookahead-game24", "e2e-scaling-game24",
}  # fmt: skip


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def test_every_section_commits_its_rows_or_is_named_as_lacking_them():
    have = {s for s in SECTIONS if (DATA / s / "rows.jsonl").is_file()}
    assert have.isdisjoint(WITHOUT_ROWS), f"now with rows, take them off WITHOUT_ROWS: {have & WITHOUT_ROWS}"
    assert set(SECTIONS) - have <= WITHOUT_ROWS, f"sections without rows.jsonl: {set(SECTIONS) - have - WITHOUT_ROWS}"


@pytest.mark.parametrize("section", [s for s in SECTIONS if s not in WITHOUT_ROWS])
def test_every_total_recounts_from_the_rows(section):
    table = json.loads((DATA / section / "results.json").read_text())["tables"]["main"]["rows"]
    lines = [json.loads(x) for x in (DATA / section / "rows.jsonl").read_text().splitlines()]
    full = {r["index"]: r for r in lines if r["budget"] == "none" and r["policy"] == "full" and not r["setting"]}
    assert full, "the reference's rows"
    for row in table:
        mine = [
            r
            for r in lines
            if (r["policy"], r["budget"], r["setting"]) == (row["policy"], row["budget"], row["setting"])
        ]
        where = f"{section}: {row['policy']} {row['budget']} {row['setting']}"
        assert len(mine) == row["problems"] == len({r["index"] for r in mine}), where
        assert sum(r["solved"] for r in mine) == row["solved_n"], where
        assert sum(r["agree"] for r in mine) == row["agree_n"], where
        assert sum(r["oom"] for r in mine) == row["oom_n"], where
        assert sum(r["solved"] and not full[r["index"]]["solved"] for r in mine) == row["gained_n"], where
        assert sum(not r["solved"] and full[r["index"]]["solved"] for r in mine) == row["lost_n"], where
        seconds = [r["seconds"] for r in mine]
        assert nearest_rank(seconds, 0.5) == pytest.approx(row["p50_s"]), where
        assert nearest_rank(seconds, 0.95) == pytest.approx(row["p95_s"]), where
        assert statistics.mean(r["nodes_as_full"] for r in mine) == pytest.approx(row["nodes_as_full"]), where
        assert statistics.mean(r["rehydrations"] for r in mine) == pytest.approx(row["rehydrations"]), where
        peak = statistics.mean(float(r["peak_device_bytes"] or 0) for r in mine) / 2**20
        assert peak == pytest.approx(row["peak_kv_mb"]), where
        for r in mine:  # a row's answer agrees with full's exactly when it says so
            assert r["agree"] == (not r["oom"] and r["answer"] == full[r["index"]]["answer"]), (where, r["index"])
