"""A tiny GGUF file of a non-Llama architecture (Qwen2), written with the ``gguf`` package.

The tokenizer is byte-level BPE (GPT-2 style, llama.cpp's ``gpt2`` model with the ``qwen2``
pre-tokenizer): the 256 byte tokens, four merges and ``<|endoftext|>``. Tensors are named through
gguf's own ``TensorNameMap``, as llama.cpp's converter names them; float32, no quantization.
"""

from __future__ import annotations

from pathlib import Path

import torch
from families import COMMON

MERGES = ["Ġ t", "Ġ a", "e r", "i n"]


def byte_level_vocab() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    return [spelling[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES] + ["<|endoftext|>"]


def write_qwen2_gguf(path: Path) -> torch.nn.Module:
    """Write a 2-layer random Qwen2 (GQA, seed 0) to ``path``; returns the model it holds."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM

    tokens = byte_level_vocab()
    eos = len(tokens) - 1
    fields = dict(vocab_size=len(tokens), bos_token_id=eos, eos_token_id=eos, pad_token_id=None)
    config = AutoConfig.for_model("qwen2", **(COMMON | fields | {"tie_word_embeddings": False}))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(config.max_position_embeddings)
    w.add_block_count(config.num_hidden_layers)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * eos + [gguf.TokenType.CONTROL])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), tensor.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
