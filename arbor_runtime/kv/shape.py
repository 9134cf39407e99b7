"""Per-token KV geometry of a model (a leaf: the pool, host tier and store all size by it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVShape:
    """Per-token KV geometry of a model: layers L, kv_heads H_kv, head_dim D, dtype, device."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token over all layers."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize

    @classmethod
    def of(cls, model: torch.nn.Module) -> KVShape:
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        param = next(model.parameters())
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return cls(cfg.num_hidden_layers, kv_heads, head_dim, param.dtype, param.device)
