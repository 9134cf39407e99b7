"""Tiny random-weight models of the major open families (2 layers, GQA), for the family matrix.

Each is built from a transformers config with a fixed seed, in eager attention (transformers' own
reference implementation of every feature: windows in the mask, soft caps, sinks), with the
SmolLM2 tokenizer (vocabulary 49,152). Sliding windows are 8 tokens: smaller than every test's
context, so the window decides what is seen.
"""

from __future__ import annotations

import functools

import torch

from arbor_runtime import LoadedModel, load_model
from arbor_runtime.loading import TINY_SHAPE

WINDOW = 8
COMMON = TINY_SHAPE | {"pad_token_id": 0}  # the tiny Llama's shape, for every family
LAYERS = ["sliding_attention", "full_attention"]
#: family -> (model_type, config fields beyond COMMON)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "mistral": ("mistral", {"sliding_window": None}),
    "mistral-window": ("mistral", {"sliding_window": WINDOW}),
    "gemma2": ("gemma2", {"sliding_window": WINDOW, "layer_types": LAYERS, "query_pre_attn_scalar": 16}),
    "gemma3": ("gemma3_text", {"sliding_window": WINDOW, "layer_types": LAYERS, "query_pre_attn_scalar": 16}),
    "phi3": ("phi3", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {"attention_multiplier": 0.25}),
    "qwen3-moe": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    # initializer_range 0.3: at 0.5 transformers' own cached decode of this model differs from its
    # one-pass forward by 4.2e-4 (whole vocabulary) on the test path, past the float32 tolerance
    "gpt-oss": (
        "gpt_oss",
        {
            "sliding_window": WINDOW,
            "layer_types": LAYERS,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "initializer_range": 0.3,
        },
    ),
}


def family_config(name: str, **overrides):
    """The transformers config of family ``name`` (``overrides`` on top)."""
    from transformers import AutoConfig

    model_type, extra = FAMILIES[name]
    return AutoConfig.for_model(model_type, **(COMMON | extra | overrides))


@functools.cache
def tokenizer():
    """The SmolLM2 tokenizer (the tiny test model's), loaded once."""
    return load_model("tiny-random", device="cpu").tokenizer


@functools.cache
def family(name: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Family ``name`` as the matrix uses it, built once per session (tests must not change it)."""
    return build_family(name, dtype)


def build_family(name: str, dtype: torch.dtype = torch.float32, **overrides) -> LoadedModel:
    """Family ``name`` with fixed random weights (seed 0), eager attention, in eval mode, with the
    SmolLM2 tokenizer; ``overrides`` change its config."""
    from transformers import AutoModelForCausalLM

    config = family_config(name, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.to(dtype).eval()
    return LoadedModel(model=model, tokenizer=tokenizer(), spec=f"tiny-{name}")
