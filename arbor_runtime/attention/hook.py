"""The transformers hook: the ``arbor_tree`` attention implementation routes each layer to the batch.

While :func:`tree_attention` is active, every attention layer of the model calls the running
batch's ``attend`` (a :class:`~arbor_runtime.batch.BatchView`) with the layer's query, the new
tokens' key / value and what the layer asked for (its scale, window, soft cap, sinks: call.py);
the batch decides what they attend (tree.py dense, sparse/step.py sparse). An argument the tree
attention does not implement raises :class:`~arbor_runtime.errors.UnsupportedModelError` (the
load-time probe, support.py, makes that happen before any search).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from arbor_runtime.attention.call import attention_call
from arbor_runtime.batch import BatchView

IMPLEMENTATION = "arbor_tree"
_ACTIVE: contextvars.ContextVar[BatchView | None] = contextvars.ContextVar("arbor_tree_batch", default=None)


def _tree_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers attention interface: query (R, Hq, q, D); key/value (R, H_kv, q, D) = the new tokens.

    ``attention_mask`` is None (no mask function is registered for this implementation): causality
    and windows come from positions, in the batch."""
    batch = _ACTIVE.get()
    if batch is None:
        raise RuntimeError("arbor_tree attention called outside a tree batch")
    out = batch.attend(module.layer_idx, query, key, value, attention_call(module, query, kwargs))
    return out, None


_registered = False


def register() -> None:
    """Register ``arbor_tree`` with transformers' attention interface (once, at the first batch).

    Not at import: ``from transformers import AttentionInterface`` costs ~10 s of CPU here (it pulls
    in transformers' integrations, ``torch.distributed.tensor`` and ``torch._dynamo``), and every
    console-script start, Ray actor and argument check would pay it before any model is needed.
    """
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(IMPLEMENTATION, _tree_attention)
        _registered = True


@contextmanager
def tree_attention(model: torch.nn.Module, batch: BatchView) -> Iterator[None]:
    """Route the model's attention through the tree attention of ``batch`` while the block runs.

    The model's attention implementation is restored in ``finally`` whatever happens. No mask is
    built by transformers for this implementation (it is not registered as a mask function).
    """
    register()
    previous = model.config._attn_implementation
    token = _ACTIVE.set(batch)
    model.config._attn_implementation = IMPLEMENTATION
    try:
        yield
    finally:
        model.config._attn_implementation = previous
        _ACTIVE.reset(token)
