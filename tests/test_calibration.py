"""MSVE calibration: leave-one-out effects are measured on real KV; the fit recovers weights."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from floats import reassociation_tol

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import ArborPolicy
from arbor_runtime.policies.msve import DEFAULT_CALIBRATION, MSVEWeights
from research.msve.calibration import continuation_loglik, fit_weights, leave_one_out

REPO = Path(__file__).resolve().parents[1]


def chain(rt, depth):
    node = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    for _ in range(depth):
        node = rt.expand(node, 1, SamplingParams(max_new_tokens=6, temperature=1.0, seed=depth))[0]
    return node


def test_unmasked_continuation_equals_recorded_logprobs(tiny):
    rt = Runtime(tiny, policy="arbor")
    leaf = chain(rt, 3)
    expected = sum(leaf.logprobs[1:]) / (leaf.length - 1)
    # recorded in decode, recomputed here in one prefill: a mean of values equal up to rounding
    tol = reassociation_tol(tiny, leaf.logprobs[1:])
    assert continuation_loglik(rt, leaf.path()[:-1], leaf) == pytest.approx(expected, abs=tol)


def test_leave_one_out_masks_each_inner_block(tiny):
    rt = Runtime(tiny, policy="arbor")
    leaf = chain(rt, 3)
    effects = leave_one_out(rt, leaf)
    assert sorted(effects) == [n.id for n in leaf.path()[1:-1]]
    assert any(abs(e) > 1e-6 for e in effects.values())  # masking real KV changes the continuation


def test_fit_recovers_signal_weights():
    rng = random.Random(0)
    feats = [tuple(rng.random() for _ in range(4)) for _ in range(200)]
    effects = [3 * s - 2 * u + 0.0 * a + 1 * d + rng.gauss(0, 0.01) for s, u, a, d in feats]
    weights, r2 = fit_weights(feats, effects)
    assert r2 > 0.99
    assert weights.search > 0 and weights.uncertainty < 0 and abs(weights.attention) < 0.1
    assert weights.search / -weights.uncertainty == pytest.approx(1.5, rel=0.05)
    with pytest.raises(ValueError, match="at least"):
        fit_weights(feats[:3], effects[:3])


def test_calibration_script_writes_what_arbor_loads(tmp_path, data_dir):
    out = tmp_path / "msve.json"
    cmd = [sys.executable, str(REPO / "scripts" / "calibrate_msve.py"), "--model", "tiny-random"]
    cmd += ["--data-dir", str(data_dir), "--game24", "0:1", "--gsm8k", "0:2", "--n-generate", "2", "--out", str(out)]
    cmd += ["--samples", str(tmp_path / "samples.jsonl")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    # the trees recorded attention (arbor without a budget does not): every signal varies over the samples
    for i, name in enumerate(("search", "uncertainty", "attention", "depth")):
        assert len({s["signals"][i] for s in samples}) > 1, name
    assert record["n_samples"] >= 6 and set(record["weights"]) == {
        "bias",
        "search",
        "uncertainty",
        "attention",
        "depth",
    }
    assert ArborPolicy(calibration=str(out)).weights == MSVEWeights(**record["weights"])


def test_shipped_calibration_is_loaded_by_default():
    """The package ships a calibration (package data); arbor reads it, not the class defaults."""
    shipped = MSVEWeights(**json.loads(DEFAULT_CALIBRATION.read_text())["weights"])
    assert ArborPolicy().weights == shipped != MSVEWeights()
    assert ArborPolicy(calibration=str(DEFAULT_CALIBRATION)).weights == shipped
    with pytest.raises(TypeError):
        ArborPolicy(weights=MSVEWeights())  # read from the calibration, never passed


def greedy_without(loaded, path, hidden, new_tokens: int) -> list[int]:
    """Greedy tokens after ``path`` by plain forwards over the whole path in which the rows from its
    last token on may not attend to block ``hidden``'s tokens (every other block keeps the KV it
    was computed with, hidden block included, as the runtime's blocks do)."""
    ids, out = [t for node in path for t in node.token_ids], []
    for _ in range(new_tokens):
        n = len(ids)
        allowed = torch.ones(n, n, dtype=torch.bool).tril()
        rows = torch.arange(path[-1].end_pos - 1, n).unsqueeze(1)
        allowed[rows, torch.arange(hidden.start_pos, hidden.end_pos).unsqueeze(0)] = False
        mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, float("-inf"))
        with torch.inference_mode():
            out.append(int(loaded.model(torch.tensor([ids]), attention_mask=mask).logits[0, -1].argmax()))
        ids.append(out[-1])
    return out


def test_regenerate_reproduces_greedy_thoughts_and_a_masked_block_changes_the_text(tiny):
    from research.msve.calibration import regenerate

    rt = Runtime(tiny, policy="arbor")
    node = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    for _ in range(3):
        node = rt.expand(node, 1, SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    root, first, second, third = node.path()
    for context, thought in (([root], first), ([root, first], second), ([root, first, second], third)):
        assert regenerate(rt, context, 6, []) == thought.text
    # the first thought masked: each regenerated token is the model's greedy choice when the
    # queries after the second thought cannot see the first one's KV, and the text changes
    masked = regenerate(rt, [root, second], 6, [])
    assert masked == rt.tokenizer.decode(greedy_without(tiny, [root, first, second], first, 6))
    assert masked != third.text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--refit", "missing.jsonl"], "missing.jsonl: no such file"),
        (["--refit", "samples.jsonl", "--baseline", "bad.json"], "--baseline bad.json: not a calibration JSON"),
        (["--refit", "samples.jsonl", "--baseline", "missing.json"], "missing.json: no such file"),
    ],
)
def test_the_script_refuses_bad_files_in_one_line(tmp_path, args, says):
    (tmp_path / "samples.jsonl").write_text("")
    (tmp_path / "bad.json").write_text('{"weights": {"bias": 1}}')
    cmd = [sys.executable, str(REPO / "scripts" / "calibrate_msve.py"), *args, "--out", "out.json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr.splitlines()[-1], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out.json").exists()
