"""The project's kvpress-equivalent policies keep, in each layer and KV head, the tokens kvpress's own
press keeps there (issue 66). kvpress cannot be installed beside this project (it pins
transformers < 5.3), so its choices are recorded once in tests/fixtures/kvpress_kept.json by
``python -m benchmarks.kvpress_kept`` (kvpress 0.5.5, SmolLM2, the 787-token few-shot context
gsm8k:6:0, 50/25/10% kept); here the project compresses the same token ids once at
``policy.granularity=head`` and compares."""

from __future__ import annotations

import json

import pytest
import torch

from arbor_runtime import Runtime, build_policy
from benchmarks.kvpress_kept import EQUIVALENT, FIXTURE
from benchmarks.linear import Prefilled, fork, kept_of, kept_tokens

#: a head whose last kept and first dropped kvpress scores differ by less than this share of the
#: last kept one is a near-tie: float32 attention summed by other kernels (kvpress runs eager
#: attention, the project its own) may keep the other token there
NEAR_TIE = 1e-4


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def head_sets(masks: list[str]) -> list[set[int]]:
    """Per KV head, the kept token indices of a hex bitmask (bit i = token i)."""
    out = []
    for mask in masks:
        bits = int(mask, 16)
        out.append({i for i in range(bits.bit_length()) if bits >> i & 1})
    return out


def project_kept(smollm2, policy: str, ids: list[int], ratios: list[float]) -> dict[float, torch.Tensor]:
    """Per compression ratio, the (L, H_kv, k) tokens each layer and KV head keeps after the project
    compresses the prefilled context once under ``policy`` per head (one prefill, forked per ratio)."""
    rt = Runtime(smollm2, build_policy(policy, granularity="head"))
    pre = Prefilled(rt, rt.new_tree_ids(ids), 0.0)
    out = {}
    for ratio in ratios:
        copy_, root = fork(pre)
        copy_.compress(kept_tokens(root.length, ratio))
        out[ratio] = kept_of(copy_, root.id)
    return out


def test_the_fixture_covers_every_equivalent_press_at_three_shares_in_every_layer_and_head(smollm2):
    data = fixture()
    cfg = smollm2.model.config
    seen = {(p["press"], p["compression_ratio"]) for p in data["presses"]}
    assert seen == {(press, r) for press in EQUIVALENT.values() for r in (0.5, 0.75, 0.9)}
    for entry in data["presses"]:
        assert len(entry["layers"]) == cfg.num_hidden_layers
        for layer in entry["layers"]:
            sets = head_sets(layer["mask"])
            assert len(sets) == cfg.num_key_value_heads
            assert {len(s) for s in sets} == {entry["kept_tokens"]}
            assert entry["kept_tokens"] == kept_tokens(len(data["context_ids"]), entry["compression_ratio"])


@pytest.mark.exactness  # kept tokens follow float scores: checked under the other CPU kernels too (make test-kernels)
@pytest.mark.parametrize("policy", sorted(EQUIVALENT))
def test_each_layer_and_kv_head_keeps_the_tokens_kvpress_keeps_there(smollm2, policy):
    data = fixture()
    entries = [p for p in data["presses"] if p["press"] == EQUIVALENT[policy]]
    mine = project_kept(smollm2, policy, data["context_ids"], [p["compression_ratio"] for p in entries])
    compared = differ = 0
    for entry in entries:
        held = mine[entry["compression_ratio"]]  # (L, H_kv, k)
        assert held.shape[-1] == entry["kept_tokens"]
        for layer, record in enumerate(entry["layers"]):
            for head, theirs in enumerate(head_sets(record["mask"])):
                ours = set(held[layer, head].tolist())
                if record["margin"][head] < NEAR_TIE * abs(record["cut"][head]):  # either token is kvpress's choice
                    assert len(ours ^ theirs) <= 2, (entry["compression_ratio"], layer, head)
                    continue
                compared += 1
                differ += ours != theirs
                assert ours == theirs, (policy, entry["compression_ratio"], layer, head, sorted(ours ^ theirs))
    assert compared >= 0.9 * sum(len(e["layers"]) * len(e["layers"][0]["mask"]) for e in entries)
    assert differ == 0


def test_bad_inputs_are_refused_in_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import benchmarks.kvpress_kept as kept

    monkeypatch.setattr("arbor_runtime.loading.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    data = tmp_path / "data"
    for argv, said in (
        (["--data-dir", str(tmp_path / "nope")], "is missing (--data-dir points at the shared data folder)"),
        (["--data-dir", str(data), "--kvpress-venv", str(tmp_path / "venv")], "has no bin/python"),
    ):
        (data / "gsm8k").mkdir(parents=True, exist_ok=True)
        for name in ("train.jsonl", "test.jsonl"):
            (data / "gsm8k" / name).write_text((json.dumps({"question": "q", "answer": "a\n#### 1"}) + "\n") * 8)
        with pytest.raises(SystemExit) as err:
            kept.main(argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert err.value.code == 2 and len(lines) == 1 and said in lines[0], (argv, lines)
