"""MSVE calibration judged held out (issue 65): the split is by tree, every signal is also fitted alone,
and ``policy.msve=<signal>`` loads that signal's own fit."""

from __future__ import annotations

import json
import random

import pytest

from arbor_runtime.policies import ArborPolicy
from arbor_runtime.policies.msve import SIGNALS, MSVEWeights
from research.msve.calibrate import write_calibration
from research.msve.heldout import report, split_trees


def samples(trees: int = 8, per_tree: int = 30, seed: int = 0) -> list[dict]:
    """Two tasks; the effect is 3 x search + noise, the other signals are noise."""
    rng = random.Random(seed)
    out = []
    for task in ("game24", "gsm8k"):
        for tree in range(trees):
            for _ in range(per_tree):
                sig = [rng.random() for _ in SIGNALS]
                out.append(
                    {"task": task, "tree": tree, "signals": sig, "ll": 3 * sig[0] + rng.gauss(0, 0.1), "outcome": None}
                )
    return out


def test_a_quarter_of_each_tasks_trees_is_held_out_whole():
    rows = samples()
    held = split_trees(rows)
    assert len(held) == 4 and {t for t, _ in held} == {"game24", "gsm8k"}  # 2 of 8 per task
    assert split_trees(rows) == held != split_trees(rows, seed=1)  # seeded
    assert split_trees([r for r in rows if r["tree"] == 0]) == set()  # one tree per task: nothing to hold out


def test_the_signal_that_drives_the_effect_predicts_held_out_trees_and_the_others_do_not():
    rows = samples()
    got = report(rows, [r["ll"] for r in rows])
    for task in ("game24", "gsm8k", "all"):
        entry = got["tasks"][task]
        assert entry["held_out_samples"] > 0 and entry["train_samples"] > entry["held_out_samples"]
        assert entry["all"]["held_out_r2"] > 0.9 and entry["search"]["held_out_r2"] > 0.9
        assert all(entry[s]["held_out_r2"] < 0.05 for s in SIGNALS[1:])
        assert entry["search"]["coef"]["search"] == pytest.approx(3.0, rel=0.1)


def test_the_calibration_file_carries_the_held_out_report_and_each_signal_alone(tmp_path):
    rows = samples()
    path = tmp_path / "msve.json"
    record = write_calibration(rows, path, {"model": "synthetic"})
    assert record["held_out"]["tasks"]["all"]["all"]["held_out_r2"] > 0.9
    assert set(record["single"]) == set(SIGNALS) and set(record["single"]["depth"]) == {"bias", "depth"}
    alone = ArborPolicy(calibration=str(path), msve="depth").weights
    assert alone == MSVEWeights(bias=record["single"]["depth"]["bias"], search=0.0, uncertainty=0.0, attention=0.0,
                                depth=record["single"]["depth"]["depth"])  # fmt: skip
    assert alone != ArborPolicy(calibration=str(path)).weights.only("depth")  # its own fit, not the joint one's
    assert json.loads(path.read_text())["weights"] == ArborPolicy(calibration=str(path)).weights.to_dict()
