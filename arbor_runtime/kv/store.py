"""Block store: device tier with token/byte accounting, host tier, and retention plans.

Pure bookkeeping around tensors: the store holds each block's retained KV keyed by node id,
counts resident tokens, moves evicted spans to the host tier (or drops them), and gathers a
path's KV for the backend. Which tokens stay is decided by a policy; the store only carries
plans out. Every change is journaled as (op, block, device delta, host delta) so event logs can
be replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arbor_runtime.kv.block import BlockKV
from arbor_runtime.kv.host import HostTier


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


@dataclass(slots=True)
class StoreCounters:
    """Movement counters of the store (tokens unless named bytes)."""

    evicted_tokens: int = 0  # moved off the device (to host or dropped)
    dropped_tokens: int = 0  # gone from every tier
    rehydrations: int = 0  # block restores from the host tier
    rehydrated_tokens: int = 0
    recomputed_tokens: int = 0
    peak_host_tokens: int = 0
    peak_host_bytes: int = 0


class KVStore:
    """Block id -> :class:`BlockKV` on the device tier, a :class:`HostTier`, and running totals."""

    def __init__(self, shape: KVShape) -> None:
        self.shape = shape
        self.host = HostTier(shape.device)
        self.counters = StoreCounters()
        self.journal: list[tuple[str, int, int, int]] = []
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

    @property
    def host_tokens(self) -> int:
        return self.host.tokens

    def dropped(self, block_id: int) -> int:
        """Tokens of a block that are in no tier (only recompute brings them back)."""
        blk = self.get(block_id)
        host = self.host.indices(block_id)
        return blk.length - blk.kept_tokens - (0 if host is None else int(host.numel()))

    # ---- updates -------------------------------------------------------------------------
    def put(self, block_id: int, block: BlockKV) -> None:
        """Add a new block (its id must be unused)."""
        if block_id in self._blocks:
            raise ValueError(f"block {block_id} is already in the store")
        self._blocks[block_id] = block
        self._change("put", block_id, block.kept_tokens, 0)

    def pop(self, block_id: int) -> BlockKV:
        """Remove a block from every tier and return its device part."""
        block = self._blocks.pop(block_id)
        host = self.host.drop(block_id)
        self._change("release", block_id, -block.kept_tokens, -host)
        return block

    def replace_whole(self, block_id: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Install recomputed KV for a whole block (drops whatever the host tier held for it)."""
        old = self.get(block_id)
        host = self.host.drop(block_id)
        new = BlockKV.full(keys, values, old.start_pos, old.next_logits)
        new.attention, new.observers = old.attention, old.observers
        self._blocks[block_id] = new
        self.counters.recomputed_tokens += new.length - old.kept_tokens - host
        self._change("recompute", block_id, new.kept_tokens - old.kept_tokens, -host)

    def apply(self, block_id: int, keep: torch.Tensor, offload: bool) -> None:
        """Carry out one block's retention plan: exactly ``keep`` (block-local indices) on device.

        Tokens leaving the device go to the host tier when ``offload``, else are dropped. Tokens in
        ``keep`` that are on the host come back (bit-identical); tokens in ``keep`` that were
        dropped cannot come back here (see :meth:`replace_whole`) and are ignored.
        """
        blk = self.get(block_id)
        keep = keep.to(blk.kept.device)
        stay = torch.isin(blk.kept, keep)
        self._evict(block_id, blk, ~stay, offload)
        host_idx = self.host.indices(block_id)
        if host_idx is not None:
            wanted = host_idx[torch.isin(host_idx, keep.cpu())]
            if wanted.numel():
                self._restore(block_id, wanted)

    def drop_host(self, block_id: int) -> int:
        """Drop a block's host span (host cap); returns tokens dropped."""
        n = self.host.drop(block_id)
        if n:
            self.counters.dropped_tokens += n
            self._change("drop_host", block_id, 0, -n)
        return n

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

    def add_attention(
        self, block_ids: Sequence[int], kept: Sequence[torch.Tensor], mass: torch.Tensor, queries: float
    ) -> None:
        """Scatter attention mass over a gathered path back to its blocks.

        Args:
            block_ids / kept: the blocks and their retained indices *as gathered* (plans may have
                changed them since); mass: (T_path,) float in gather order; queries: how many
                recorded queries produced it. Released blocks are skipped.
        """
        offset = 0
        for block_id, idx in zip(block_ids, kept, strict=True):
            n = int(idx.numel())
            if block_id in self._blocks:
                blk = self._blocks[block_id]
                blk.attention.index_add_(0, idx.cpu(), mass[offset : offset + n].cpu())
                blk.observers += queries
            offset += n

    # ---- internals -----------------------------------------------------------------------
    def _evict(self, block_id: int, blk: BlockKV, leave: torch.Tensor, offload: bool) -> None:
        n = int(leave.sum())
        if n == 0:
            return
        if offload:
            self.host.put(block_id, blk.kept[leave], blk.keys[:, :, leave], blk.values[:, :, leave])
        stay = ~leave
        blk.keys, blk.values, blk.kept = blk.keys[:, :, stay], blk.values[:, :, stay], blk.kept[stay]
        self.counters.evicted_tokens += n
        if not offload:
            self.counters.dropped_tokens += n
        self._change("evict" if offload else "drop", block_id, -n, n if offload else 0)

    def _restore(self, block_id: int, idx: torch.Tensor) -> None:
        blk = self.get(block_id)
        keys, values = self.host.take(block_id, idx)
        all_idx = torch.cat([blk.kept, idx.to(blk.kept.device)])
        order = torch.argsort(all_idx)
        blk.kept = all_idx[order]
        blk.keys = torch.cat([blk.keys, keys], dim=2)[:, :, order]
        blk.values = torch.cat([blk.values, values], dim=2)[:, :, order]
        self.counters.rehydrations += 1
        self.counters.rehydrated_tokens += int(idx.numel())
        self._change("rehydrate", block_id, int(idx.numel()), -int(idx.numel()))

    def _change(self, op: str, block_id: int, device_delta: int, host_delta: int) -> None:
        self._resident_tokens += device_delta
        self.journal.append((op, block_id, device_delta, host_delta))
        if self.host.tokens > self.counters.peak_host_tokens:
            self.counters.peak_host_tokens = self.host.tokens
            self.counters.peak_host_bytes = self.host.tokens * self.shape.bytes_per_token
