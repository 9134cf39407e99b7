"""What sliding-window layers can no longer read: device KV outside every live reader's window.

A layer with window ``w`` lets a query at position ``p`` see keys at positions ``> p - w``. In a
search tree every live node may still be expanded (or, a shared prefix, attached below): its next
token sits at its ``end_pos`` and every later token further on. So a block's token at position
``t`` can still be read in that layer only if a live node whose path holds the block has
``t > end_pos - w``; every retained token at or before ``min(end_pos of the block's readers) - w``
is memory a window-only layer could free (SGLang's SWA pool, vLLM's hybrid allocator). A block no
live node reads is dead in every window layer.

The device pool does not free it: a block's slots hold every layer, and the budget charges every
layer. This module measures what a per-layer pool would save; :class:`~arbor_runtime.metrics.RuntimeMetrics`
reports it (``window_dead_bytes_max``) and each trace point carries it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from arbor_runtime.kv.store import KVStore

#: a live reader: the block ids of its KV path (root side first) and its ``end_pos``
Reader = tuple[Sequence[int], int]


def reach(store: KVStore, readers: Iterable[Reader]) -> dict[int, int]:
    """Stored block id -> the smallest ``end_pos`` of the live readers whose path holds it."""
    out: dict[int, int] = {}
    for path, end in readers:
        for block_id in path:
            if block_id in store and end < out.get(block_id, end + 1):
                out[block_id] = end
    return out


def window_dead_tokens(store: KVStore, reached: dict[int, int], window: int) -> int:
    """Device tokens no live reader sees in a layer with this ``window`` (``reached``: :func:`reach`)."""
    dead = 0
    for block_id in store.block_ids():
        blk = store.get(block_id)
        if block_id not in reached:
            dead += blk.kept_tokens
        elif blk.kept_tokens:
            dead += int(torch.count_nonzero(blk.positions <= reached[block_id] - window))
    return dead


def window_dead_bytes(store: KVStore, readers: Iterable[Reader], windows: dict[int, int]) -> int:
    """Device KV bytes that window layers (``windows``: layer -> window) no longer read: their dead
    tokens times one layer's K and V per token."""
    if not windows:
        return 0
    reached = reach(store, readers)
    per_layer = store.shape.bytes_per_token // store.shape.layers
    counts = {w: window_dead_tokens(store, reached, w) for w in set(windows.values())}
    return sum(counts[w] for w in windows.values()) * per_layer
