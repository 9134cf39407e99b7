"""Random-weight Llamas for device checks: no download, no tokenizer files.

:func:`llama8b_config` is shaped like Llama-3-8B (32 layers, 32 query / 8 KV heads of 128, hidden
4096, MLP 14336; a 32000-token vocabulary by default): the KV geometry and the per-token compute
of the real model's layers, random weights. :class:`IdTokenizer` stands in for a tokenizer when a workload only moves
token ids (the runtime decodes ids for node texts and stop strings, nothing else).
"""

from __future__ import annotations

from typing import Any

import torch

from arbor_runtime import LoadedModel


class IdTokenizer:
    """Token ids as text: ``"17 4 99"`` <-> ``[17, 4, 99]``. No special tokens, no EOS."""

    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids: Any, **kwargs: Any) -> str:
        return " ".join(str(int(i)) for i in ids)


def llama8b_config(vocab_size: int = 32000):
    """Llama-3-8B's shape (a LlamaConfig), for random weights.

    The vocabulary defaults to 32000 (Llama-2's), not 128256: it does not change the KV, and a
    teacher-forced block's full-vocabulary float32 log-probabilities (the runtime scores every
    forced token) would otherwise add ~2 GB per 1024 tokens of transient memory to every run.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )


def smollm2_shape_config(max_positions: int):
    """A LlamaConfig with SmolLM2-135M's shape (30 layers, 9 query / 3 KV heads of 64, hidden 576,
    MLP 1536, 49,152-token vocabulary) and room for ``max_positions`` positions."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=max_positions,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )


def random_model(config, device: str | torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """A ``LlamaForCausalLM`` with random weights built directly on ``device`` in ``dtype``."""
    from transformers import LlamaForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    # built in ``dtype`` already; no .to(dtype): RoPE's inv_freq buffer stays float32
    return LoadedModel(model=model.to(device=device).eval(), tokenizer=IdTokenizer(), spec="random")
