"""Model loading: specs, errors, the SmolLM2 conversion cache."""

from __future__ import annotations

import pytest
import torch

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


def test_a_non_llama_gguf_loads_through_the_same_loader_and_is_exact(tmp_path):
    """A Qwen2 GGUF written here: ``load_model(path)`` gives the same model (logits identical), its
    geometry reads from the header, and a branched tree on it equals ``generate`` on every path."""
    from gguf_model import write_qwen2_gguf
    from test_branched_exactness import check_every_path, grow

    from arbor_runtime import Runtime, SamplingParams
    from arbor_runtime.loading import inspect_model

    source = write_qwen2_gguf(tmp_path / "tiny-qwen2.gguf")
    loaded = load_model(str(tmp_path / "tiny-qwen2.gguf"), device="cpu")
    assert type(loaded.model).__name__ == "Qwen2ForCausalLM"
    ids = torch.tensor([loaded.tokenizer("Input: 4 4 6 8\nSteps:\n").input_ids])
    assert ids.shape[1] > 10 and int(ids.max()) < source.config.vocab_size
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, source(ids).logits)
    geometry = inspect_model(str(tmp_path / "tiny-qwen2.gguf"), device="cpu")
    assert (geometry.layers, geometry.kv_heads, geometry.head_dim) == (2, 2, 16)
    rt = Runtime(loaded, policy="full")
    # a 261-token vocabulary makes <|endoftext|> a likely greedy token: rows go on through it, and
    # generate must not suppress it (min_new_tokens does, for the model's EOS)
    loaded.model.generation_config.eos_token_id = None
    leaves = grow(rt, SamplingParams(max_new_tokens=6, temperature=0.0, stop_at_eos=False))
    assert check_every_path(loaded, rt, leaves) >= 5 * 2
