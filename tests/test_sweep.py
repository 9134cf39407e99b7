"""Sweeps: merging job results (tags, groups, statistics) and a real two-job sweep with the joblib launcher."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import hydra_plugins.hydra_joblib_launcher  # noqa: F401  (the sweep extra installs it; fail loudly if absent)
import yaml

from arbor_cli.sweep import markdown_table, merge

REPO = Path(__file__).resolve().parents[1]


def fake_job(sweep: Path, name: str, overrides: list[str], controller: str, policy: dict, rows: list[dict]) -> None:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    choices = {"task": "game24", "controller": controller, "policy": "arbor"}
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": choices}}}))
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"policy": policy}))
    (job / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(index: int, **fields) -> dict:
    base = {"index": index, "task": "game24", "policy": "arbor", "solved": False, "oom": False, "seconds": 1.0}
    return base | {"peak_device_tokens": 100, "peak_host_bytes": 2**20, "rehydrations": 1, "trace": [1]} | fields


def test_merge_tags_rows_and_groups_them(tmp_path):
    ratio = {"budget_tokens": None, "budget_ratio": 0.5}
    fake_job(tmp_path, "a", ["controller=bfs", "seed=0"], "bfs", ratio, [row(0, solved=True, seconds=1.0), row(1)])
    fake_job(tmp_path, "b", ["controller=bfs", "seed=1"], "bfs", ratio, [row(0, seconds=3.0, oom=True)])
    fake_job(tmp_path, "c/d", ["controller=dfs", "seed=0"], "dfs", {"budget_tokens": 800}, [row(0, seconds=5.0)])
    merged = merge(tmp_path)
    with merged.csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    expected = [("a", "0", "bfs"), ("a", "1", "bfs"), ("b", "0", "bfs"), ("c/d", "0", "dfs")]
    assert [(r["job"], r["index"], r["controller"]) for r in rows] == expected
    assert rows[0]["override.seed"] == "0" and rows[0]["overrides"] == "controller=bfs,seed=0"
    assert "trace" not in rows[0]  # lists are left out of the CSV
    by_key = {(s["controller"], s["budget"], s["variant"]): s for s in merged.summary}
    assert set(by_key) == {("bfs", "0.5x", "seed=0"), ("bfs", "0.5x", "seed=1"), ("dfs", "800", "seed=0")}
    a = by_key["bfs", "0.5x", "seed=0"]
    assert a["problems"] == 2 and a["solved_rate"] == 0.5 and a["oom_rate"] == 0 and a["rehydrations"] == 2
    assert a["seconds_p50"] == 1.0 and a["peak_host_bytes"] == 2**20
    assert by_key["bfs", "0.5x", "seed=1"]["oom_rate"] == 1.0
    md = merged.md_path.read_text().splitlines()
    assert md[0].startswith("| task | controller | policy | budget | variant | problems | solved |")
    assert len(md) == 2 + 3 and "| game24 | dfs | arbor | 800 | seed=0 | 1 | 0% | 5.00 |" in md[4]


def test_markdown_leaves_out_an_empty_variant_column():
    summary = [{"task": "t", "controller": "bfs", "policy": "full", "budget": "none", "variant": "", "problems": 1}]
    assert "variant" not in markdown_table(summary, drop_empty=("variant",))


def test_merge_script_without_results_says_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "merge_sweep.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "no results.jsonl under sweep dir" in proc.stderr


def test_two_job_sweep_with_the_joblib_launcher(data_dir, tmp_path):
    """A two-job sweep with the joblib launcher produces two result files and the merged table."""
    sweep = tmp_path / "sweep"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "arbor_cli.solve", "-m", "model=tiny-random", f"paths.data_dir={data_dir}",
        "task.start=900", "task.end=901", "controller=bfs,best_first", "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(sweep.rglob("results.jsonl"))
    assert len(results) == 2
    assert {p.parent.name.split(",")[0] for p in results} == {"controller=bfs", "controller=best_first"}
    assert all((p.parent / "trees" / "900.json").is_file() for p in results)
    merge_cmd = [sys.executable, str(REPO / "scripts" / "merge_sweep.py"), str(sweep)]
    proc = subprocess.run(merge_cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (sweep / "merged.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 and {r["controller"] for r in rows} == {"bfs", "best_first"}
    assert (sweep / "merged.md").is_file() and "best_first" in (sweep / "merged.md").read_text()


def test_two_policies_two_budgets_sweep_merges(data_dir, tmp_path):
    """A tiny end-to-end sweep (tiny model, 2 policies x 2 budgets, 1 problem) and its merged table."""
    sweep = tmp_path / "sweep"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "arbor_cli.solve", "-m", "model=tiny-random", f"paths.data_dir={data_dir}",
        "task.start=901", "task.end=902", "policy=full,arbor", "policy.budget_tokens=700,2000",
        f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(sweep.rglob("results.jsonl"))) == 4
    merge_cmd = [sys.executable, str(REPO / "scripts" / "merge_sweep.py"), str(sweep)]
    proc = subprocess.run(merge_cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (sweep / "merged.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["policy"], r["budget_tokens"]) for r in rows) == [
        ("arbor", "2000"), ("arbor", "700"), ("full", "2000"), ("full", "700"),
    ]  # fmt: skip
    assert all(int(r["peak_device_tokens"]) <= int(r["budget_tokens"]) for r in rows)
