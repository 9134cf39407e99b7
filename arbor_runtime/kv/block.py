"""One thought block's KV on the device tier."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class BlockKV:
    """KV of one block, for every layer, restricted to the tokens that stay on the device.

    Attributes:
        keys: (L, H_kv, T_kept, D) RoPE-rotated keys of the retained tokens, model dtype.
        values: (L, H_kv, T_kept, D).
        kept: (T_kept,) long, sorted indices (into the block's tokens) of the retained tokens.
        start_pos: position id of the block's first token; token i has position start_pos + i.
        length: tokens in the whole block (retained or not).
        next_logits: (V,) float32 logits for the token after the block, on the host; children are
            sampled from them, so a block's last position is never computed twice.
        attention: (length,) float32 attention mass each token received from later queries
            (summed over layers, heads and queries; kept for evicted tokens too).
        observers: how many recorded queries could see the block (attention / observers is the
            block's attention per query, free of the bias toward old blocks).
    """

    keys: torch.Tensor
    values: torch.Tensor
    kept: torch.Tensor
    start_pos: int
    length: int
    next_logits: torch.Tensor
    attention: torch.Tensor
    observers: float = 0.0

    @property
    def kept_tokens(self) -> int:
        return int(self.keys.shape[2])

    @property
    def whole(self) -> bool:
        return self.kept_tokens == self.length

    @property
    def positions(self) -> torch.Tensor:
        """(T_kept,) original position ids of the retained tokens."""
        return self.kept + self.start_pos

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    @classmethod
    def full(cls, keys: torch.Tensor, values: torch.Tensor, start_pos: int, next_logits: torch.Tensor) -> BlockKV:
        """A block with every token retained. keys/values: (L, H_kv, T, D)."""
        length = int(keys.shape[2])
        kept = torch.arange(length, device=keys.device)
        return cls(keys, values, kept, start_pos, length, next_logits, torch.zeros(length))
