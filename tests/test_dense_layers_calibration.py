"""Calibrating ``dense_layers="auto"`` for a model a user brings (benchmarks.longctx.calibrate): the layer
rule reproduces the shipped SmolLM2 entry from its committed sweep rows, the command writes an entry that
lychee's ``auto`` then reads ahead of the shipped table, and bad input stops before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arbor_runtime.policies import LycheePolicy
from arbor_runtime.policies.kvp_weights import model_fingerprint
from arbor_runtime.sparse import calibrated
from benchmarks.longctx.calibrate import choose_layers, layer_counts, main, suite_items

REPO = Path(__file__).resolve().parents[1]
#: knobs under which the tiny random model's sparse answers part from dense's within a few items
SMALL_READ = "token_budget=16+token_share=0+dense_below=0+min_chunk_tokens=2+max_chunk_tokens=4+sink_tokens=4"


def sweep_row(index: int, case: str, margin: float) -> dict:
    return {"task": "t", "length": 8, "index": index, "seed": 0, "case": case, "margin": margin}


def test_the_rule_names_layer_7_from_the_committed_smollm2_sweeps():
    """From the all-layer sweeps on two seed-1 items and on three seed-2 items (the calibration command's own
    rows) and the layer-7 rows of the three seed-0 items (committed with the shipped entry), the rule picks
    layer 7 alone, the shipped SmolLM2 entry."""
    for name in ("calibration_seed1.jsonl", "calibration_seed2.jsonl", "ablation.jsonl"):
        rows = [json.loads(line) for line in (REPO / "docs/data/longctx-layer7" / name).read_text().splitlines()]
        assert choose_layers(rows) == [7]
    assert [e.layers for e in calibrated.DENSE_LAYERS.values()] == [(7,)]


def test_layers_are_chosen_by_items_fixed_then_margin_recovered():
    rows = [sweep_row(i, c, m) for i, c, m in [
        (0, "sparse", -1.0), (0, "dense", 3.0), (0, "whole:2", 1.0), (0, "whole:5", 2.0), (0, "whole:1", -0.5),
        (1, "sparse", -2.0), (1, "dense", 2.0), (1, "whole:2", 0.5), (1, "whole:5", -1.0), (1, "whole:1", -1.5),
        (2, "sparse", -1.0), (2, "dense", 1.0), (2, "whole:2", 0.1), (2, "whole:5", -0.9), (2, "whole:1", 0.2),
    ]]  # fmt: skip
    counts = layer_counts(rows)
    assert {layer: c["fixed"] for layer, c in counts.items()} == {1: 1, 2: 3, 5: 1}
    assert counts[5]["recovered"] == pytest.approx((3 / 4 + 1 / 4 + 0.1 / 2) / 3)
    assert choose_layers(rows) == [2]  # layer 5 fixes 1 of 3: under half
    assert choose_layers(rows, share=0.3) == [2, 5]  # ties on one item fixed: 5 recovers more than 1
    assert choose_layers(rows, share=0.3, most=1) == [2]
    assert choose_layers([]) == []  # nothing parted: nothing to read whole
    spread = [r for r in rows if r["case"] != "whole:2"]
    assert choose_layers(spread) == []  # no single layer fixes half: the loss has no one layer to name


def test_items_visit_each_index_across_the_tasks():
    assert suite_items(["a", "b"], 3, 2) == [("a", 3), ("b", 3), ("a", 4), ("b", 4)]


@pytest.mark.parametrize("argv, named", [
    (["--tasks", "niah_nothing"], "--tasks 'niah_nothing'"),
    (["--lost", "0"], "--lost 0 must be >= 1"),
    (["--share", "1.5"], "--share 1.5 must be in (0, 1]"),
    (["--policy", "dense_layers=[7]"], "dense_layers is what the calibration chooses"),
    (["--policy", "token_share=2"], "token_share"),
])  # fmt: skip
def test_bad_arguments_exit_2_before_the_model_loads(argv, named, capsys, monkeypatch):
    import arbor_runtime

    monkeypatch.setattr(arbor_runtime, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("calibrate: ") and named in err and err.count("\n") == 1


def test_an_unknown_model_is_one_line_and_exit_2(capsys):
    assert main(["--model", "/nowhere/model.gguf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("calibrate: --model '/nowhere/model.gguf'") and err.count("\n") == 1


def test_the_written_entry_is_what_auto_reads_ahead_of_the_shipped_table(tiny, tmp_path, monkeypatch, one_torch_thread):
    """The command on the tiny model (a tight read, so answers part): its rows give the layers it reports
    and writes; a lychee policy at ``auto`` bound to that model then reads those layers whole, though the
    shipped table lists another for it; a second model's entry is kept when the file is rewritten."""
    path = tmp_path / "dense_layers.json"
    monkeypatch.setattr(calibrated, "calibration_path", lambda cache_dir=None: path)
    path.write_text(json.dumps({"models": {"0123": {"model": "other", "layers": [3], "source": "x"}}}))
    rows_file = tmp_path / "rows.jsonl"
    argv = ["--model", "tiny-random", "--length", "256", "--items", "2", "--lost", "2", "--policy", SMALL_READ,
            "--any-parting", "--rows", str(rows_file), "--write"]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert rows and {r["case"] for r in rows} >= {"sparse", "dense", "whole:0", "whole:1", "alone:0"}
    chosen = choose_layers(rows)
    models = json.loads(path.read_text())["models"]
    entry = models[model_fingerprint(tiny.model)]
    assert entry["layers"] == chosen and entry["model"] == "tiny-random" and "--write" in entry["source"]
    assert models["0123"]["layers"] == [3]
    shipped = tuple(x for x in (0, 1) if x not in chosen) or (0, 1)  # another entry, in the shipped table
    monkeypatch.setitem(calibrated.DENSE_LAYERS, model_fingerprint(tiny.model),
                        calibrated.DenseLayers("tiny", shipped, "shipped, in this test"))  # fmt: skip
    policy = LycheePolicy()
    policy.bind(tiny.model)
    assert policy.model_dense_layers == chosen


def test_a_broken_calibration_file_is_named(tmp_path):
    path = tmp_path / "dense_layers.json"
    for text in ("{", '{"models": {"ab": {"model": "m", "layers": [1.5], "source": "s"}}}', '{"m": 1}'):
        path.write_text(text)
        with pytest.raises(ValueError, match=f"{path}: not a dense-layers calibration file"):
            calibrated.read_calibrations(path)
    assert calibrated.read_calibrations(tmp_path / "absent.json") == {}
