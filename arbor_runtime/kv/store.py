"""Device-tier block store with token/byte accounting.

Pure bookkeeping around tensors: the store holds each block's retained KV keyed by node id,
counts resident tokens and bytes, and gathers a path's KV for the backend. Which tokens stay is
decided by a policy; the store only carries plans out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arbor_runtime.kv.block import BlockKV


@dataclass(frozen=True, slots=True)
class KVShape:
    """Per-token KV geometry of a model.

    Attributes:
        layers: L; kv_heads: H_kv; head_dim: D; dtype: cache dtype; device: where KV lives.
    """

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


class KVStore:
    """Block id -> :class:`BlockKV` on the device tier, with running totals."""

    def __init__(self, shape: KVShape) -> None:
        self.shape = shape
        self._blocks: dict[int, BlockKV] = {}
        self._resident_tokens = 0

    # ---- queries -------------------------------------------------------------------------
    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, block_id: int) -> BlockKV:
        try:
            return self._blocks[block_id]
        except KeyError:
            raise KeyError(f"block {block_id} has no KV in the store (released?)") from None

    def block_ids(self) -> list[int]:
        return list(self._blocks)

    @property
    def resident_tokens(self) -> int:
        """Retained tokens over all blocks on the device tier."""
        return self._resident_tokens

    @property
    def resident_bytes(self) -> int:
        return self._resident_tokens * self.shape.bytes_per_token

    # ---- updates -------------------------------------------------------------------------
    def put(self, block_id: int, block: BlockKV) -> None:
        """Add a new block (its id must be unused)."""
        if block_id in self._blocks:
            raise ValueError(f"block {block_id} is already in the store")
        self._blocks[block_id] = block
        self._resident_tokens += block.kept_tokens

    def pop(self, block_id: int) -> BlockKV:
        """Remove a block and return it."""
        block = self._blocks.pop(block_id)
        self._resident_tokens -= block.kept_tokens
        return block

    # ---- path gathering ------------------------------------------------------------------
    def gather(self, block_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Concatenate the retained KV of blocks in path order.

        Returns:
            keys (L, H_kv, T, D), values (L, H_kv, T, D), positions (T,) long original position ids.
        """
        blocks = [self.get(b) for b in block_ids]
        keys = torch.cat([b.keys for b in blocks], dim=2)
        values = torch.cat([b.values for b in blocks], dim=2)
        positions = torch.cat([b.positions for b in blocks])
        return keys, values, positions
