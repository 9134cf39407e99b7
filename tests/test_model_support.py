"""Models the runtime cannot serve exactly are refused when they load, with one line naming the model
type and what is missing (issue 45); ``arbor-solve`` exits 2 before any search. A model missing from
the local HF cache is one line saying how to get it."""

from __future__ import annotations

import json

import pytest
import torch
from families import build_family, tokenizer
from test_cli import compose_cfg, tiny_overrides

from arbor_cli.run import run
from arbor_runtime import LoadedModel, Runtime, UnsupportedModelError
from arbor_runtime.attention.support import check_config, model_attention
from arbor_runtime.loading import inspect_model

SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def tiny(model_type: str, **fields) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **(SMALL | fields))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize(
    ("model_type", "fields", "message"),
    [
        ("bloom", {"n_head": 4, "n_layer": 2}, "'bloom' is not supported: ALiBi position biases"),
        ("falcon", {"alibi": False}, "'falcon' is not supported: its attention does not go through the transformers"),
        ("mamba", {}, "'mamba' is not supported: its attention does not go through"),
        ("qwen3_next", {"num_key_value_heads": 2}, "'qwen3_next' is not supported: layer types linear_attention"),
    ],
)
def test_families_it_cannot_serve_are_refused_in_one_line(model_type, fields, message):
    with pytest.raises(UnsupportedModelError, match=message) as err:
        model_attention(tiny(model_type, **fields))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"model_type": "t5", "is_encoder_decoder": True}, "'t5' is not supported: an encoder-decoder model"),
        ({"model_type": "llava", "vision_config": {"hidden_size": 8}}, "'llava' is not supported: a multimodal model"),
        ({"model_type": "gemma3", "text_config": {"num_hidden_layers": 2}}, "a multimodal model \\(text_config\\)"),
        ({"model_type": "mpt", "attn_config": {"alibi": True}}, "ALiBi"),
        ({"model_type": "llama4_text", "attention_chunk_size": 8192}, "chunked attention"),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "bidirectional attention"),
    ],
)
def test_configs_are_refused_before_any_weight_loads(cfg, message, tmp_path):
    with pytest.raises(UnsupportedModelError, match=message):
        check_config(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a model folder without weights
    with pytest.raises(UnsupportedModelError, match=message):
        inspect_model(str(tmp_path))


class Silent(torch.nn.Module):
    """An attention layer that never calls the attention interface (a linear-attention stand-in)."""

    def forward(self, hidden_states, *args, **kwargs):
        return torch.zeros_like(hidden_states), None


def test_a_layer_that_bypasses_the_attention_interface_is_refused():
    model = build_family("llama").model
    model.model.layers[1].self_attn = Silent()
    with pytest.raises(UnsupportedModelError, match="'llama' is not supported: .*layers 1 never call it"):
        model_attention(model)


def test_an_argument_the_tree_attention_lacks_is_refused_at_load():
    """A layer that passes ALiBi slopes (or anything else not implemented) to the attention function."""
    model = build_family("llama").model
    for layer in model.model.layers:
        forward = layer.self_attn.forward
        layer.self_attn.forward = lambda *a, _f=forward, **k: _f(*a, **k, alibi_slopes=torch.ones(4))
    with pytest.raises(UnsupportedModelError, match="'llama': its attention passes alibi_slopes, which the tree"):
        Runtime(LoadedModel(model=model, tokenizer=tokenizer(), spec="patched"))


def test_a_window_only_in_the_mask_is_refused():
    """A config that declares a sliding window its attention call never carries (Llama's layers pass
    none): served, it would attend the whole context."""
    model = build_family("llama").model
    model.config.sliding_window = 8
    with pytest.raises(UnsupportedModelError, match="window of 8 on layer 0 but the attention call carries None"):
        model_attention(model)


def test_a_model_in_training_mode_is_refused():
    model = build_family("qwen2", attention_dropout=0.1).model.train()
    with pytest.raises(UnsupportedModelError, match="attention dropout 0.1"):
        model_attention(model)


def test_qwen25_configs_are_plain_attention():
    """Qwen2.5 checkpoints declare a sliding window but switch it off (use_sliding_window: false)."""
    fields = {"sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 1}
    assert model_attention(build_family("qwen2", **fields).model).plain
    on = build_family("qwen2", sliding_window=8, use_sliding_window=True, max_window_layers=1)
    assert model_attention(on.model).windows == {1: 8}  # transformers' rule: layers from max_window_layers on


@pytest.mark.parametrize("policy", ["quest", "lychee"])
def test_sparse_decode_refuses_a_windowed_model(policy, tiny):
    loaded = build_family("gemma2")
    with pytest.raises(UnsupportedModelError, match=f"policy={policy}: sparse decode attention serves plain"):
        Runtime(loaded, policy=policy)
    Runtime(tiny, policy=policy)  # plain attention: served


def test_arbor_solve_refuses_an_unsupported_model_before_any_search(data_dir, tmp_path, capsys):
    folder = tmp_path / "bloom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bloom", **SMALL}))
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path / "run", f"model.spec={folder}"))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("arbor-solve: error: model type 'bloom' is not supported: ALiBi") and "\n" not in err
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_arbor_solve_refuses_what_only_the_load_time_probe_finds(data_dir, tmp_path, capsys):
    """A Falcon folder (config and weights): its config passes, the loaded model's attention does not go
    through the interface; refused when it loads, before any search, exit 2."""
    folder = tmp_path / "falcon"
    tiny("falcon", alibi=False).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    capsys.readouterr()  # save_pretrained's progress bar
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path / "run", f"model.spec={folder}"))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' weight-loading progress bar
    assert err.startswith("arbor-solve: error: model type 'falcon' is not supported: its attention does not go")
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_arbor_solve_refuses_sparse_decode_over_a_windowed_model_before_any_search(data_dir, tmp_path, capsys):
    folder = tmp_path / "gemma2"
    loaded = build_family("gemma2")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    capsys.readouterr()  # save_pretrained's progress bar
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path / "run", f"model.spec={folder}", "policy=quest"))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' weight-loading progress bar
    assert err.startswith("arbor-solve: error: policy=quest: sparse decode attention serves plain attention only")
    assert not (tmp_path / "run" / "results.jsonl").exists()


@pytest.mark.parametrize(
    ("option", "model_id"),
    [
        ("qwen2.5-0.5b-instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("qwen2.5-1.5b-instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct"),
        ("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ],
)
def test_a_paper_model_missing_from_the_cache_is_one_line_saying_how_to_get_it(
    option, model_id, data_dir, tmp_path, capsys, monkeypatch
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # whatever this machine holds
    overrides = tiny_overrides(data_dir, tmp_path / "run")
    cfg = compose_cfg(*[o for o in overrides if not o.startswith("model=")], f"model={option}")
    assert cfg.model.spec == model_id
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"arbor-solve: error: model {model_id!r} is not in the local Hugging Face cache ({tmp_path / 'empty-hub'}) "
        f"and the runtime does not download: fetch it once with `hf download {model_id}` (huggingface_hub's CLI), "
        "then run again"
    )
    assert not (tmp_path / "run" / "results.jsonl").exists()
