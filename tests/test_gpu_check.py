"""The device check script's dry run (what CI can run of it): tests, then every policy and budget
on the tiny model through the same code, one JSON and a table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from arbor_cli.bench.gpu_check import DRY_WORKLOAD, plan

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_runs_every_policy_and_budget_and_checks_the_restore_order(tmp_path):
    env = os.environ | {"PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "full peak" in proc.stdout and "arbor" in proc.stdout  # the table
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and report["kernel"] == "cpu_flash"
    tests = report["tests"]
    assert tests["failures"] == tests["errors"] == 0 and tests["passed"] > 0 and tests["skipped"] > 0

    runs = {(r["policy"], r["fraction"]): r for r in report["runs"]}
    assert list(runs) == plan(["full", "h2o", "streaming", "thinkv", "arbor"], [1.0, 0.5, 0.25])
    peak = report["full_peak_tokens"]
    assert peak >= DRY_WORKLOAD.tokens and runs[("full", 1.0)]["peak_device_kv_tokens"] == peak
    assert runs[("full", 0.5)]["oom"] and runs[("full", 0.25)]["oom"]
    for (policy, fraction), r in runs.items():
        assert "skipped" not in r and not r["truncated"] and r["peak_device_kv_tokens"] <= r["budget_tokens"]
        assert r["host_syncs"] == 0 and r["restores_inside_forward"] == 0
        if r["oom"] is None:
            assert r["tree_tokens"] >= DRY_WORKLOAD.tokens and r["decode_tokens_per_s"] > 0
        if policy in ("h2o", "streaming", "thinkv") and fraction < 1.0:
            assert r["dropped_tokens"] > 0 and r["rehydrated_tokens"] == 0
    for fraction in (0.5, 0.25):
        arbor = runs[("arbor", fraction)]
        assert arbor["oom"] is None and arbor["rehydrated_tokens"] > 0
        assert arbor["restore_bytes"] == arbor["rehydrated_tokens"] * 512  # tiny model: 512 bytes of K/V per token
        assert arbor["compute_waits"] >= arbor["restore_batches"] > 0 and arbor["restore_gb_per_s"] > 0
