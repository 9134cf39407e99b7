"""Model loading: specs, errors, the SmolLM2 conversion cache."""

from __future__ import annotations

import pytest

from arbor_runtime import ModelSpecError, load_model
from arbor_runtime.loading import default_cache_dir, smollm2_gguf_path


def test_smollm2_is_the_embedded_gguf(smollm2):
    assert smollm2_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    cfg = smollm2.model.config
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads) == (30, 3)
    assert (default_cache_dir() / "smollm2-135m-instruct" / "config.json").is_file()
    assert next(smollm2.model.parameters()).dtype.is_floating_point


def test_tiny_random_is_deterministic():
    a, b = load_model("tiny-random"), load_model("tiny-random")
    wa, wb = a.model.model.embed_tokens.weight, b.model.model.embed_tokens.weight
    assert a.model.config.num_hidden_layers == 2
    assert (wa == wb).all()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("/nonexistent/model.gguf", "does not exist"),
        ("no-such-org/no-such-model", "not in the local Hugging Face cache .* `hf download no-such-org/no-such-model`"),
        ("no-such-model", "neither a known name"),
        ("", "empty"),
    ],
)
def test_bad_specs_raise_clear_errors(spec, message):
    with pytest.raises(ModelSpecError, match=message):
        load_model(spec)


def test_local_dir_without_config(tmp_path):
    with pytest.raises(ModelSpecError, match="no config.json"):
        load_model(str(tmp_path))


def test_bad_dtype():
    with pytest.raises(ModelSpecError, match="float33"):
        load_model("tiny-random", dtype="float33")
