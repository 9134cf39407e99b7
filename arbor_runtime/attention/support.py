"""Which models the tree attention serves: each is served exactly, or refused when it loads.

Two checks, both ending in one :class:`~arbor_runtime.errors.UnsupportedModelError` line that names
the model type and what is missing:

- :func:`check_config` reads a config alone (no weights; ``arbor-solve`` runs it before loading):
  encoder-decoder and multimodal models, ALiBi biases, attention that lives only in the mask
  (chunked attention, bidirectional flags), layer types other than full and sliding attention.
- :func:`model_attention` probes a loaded model once (a two-token forward under the tree attention
  hook, every layer's call recorded; cached per model): every layer must call the transformers
  attention interface once, with K/V of the pool's geometry and only the arguments the tree
  attention implements (attention/call.py). A window the config declares must reach the call
  (a window only in transformers' mask would be silently dropped).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from arbor_runtime.attention.call import AttentionCall
from arbor_runtime.attention.hook import tree_attention
from arbor_runtime.errors import UnsupportedModelError
from arbor_runtime.kv.shape import KVShape

#: config keys that mean another modality's encoder rides along
MULTIMODAL_KEYS = ("vision_config", "audio_config", "speech_config", "vision_tower", "mm_vision_tower", "text_config")
#: layer types the tree attention serves (transformers' ``config.layer_types``)
SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """What one layer's attention asks for: its sliding window, soft cap, and whether it has sinks."""

    window: int | None = None
    softcap: float | None = None
    sinks: bool = False


@dataclass(frozen=True, slots=True)
class ModelAttention:
    """What a model's attention asks for, per layer (read by the load-time probe)."""

    model_type: str
    layers: tuple[LayerAttention, ...]

    @property
    def plain(self) -> bool:
        """Every layer is plain scaled softmax attention (no window, cap or sinks)."""
        return all(layer == LayerAttention() for layer in self.layers)

    @property
    def windows(self) -> dict[int, int]:
        """Layer index -> its sliding window, for the layers that have one."""
        return {i: layer.window for i, layer in enumerate(self.layers) if layer.window is not None}

    def describe(self) -> str:
        """One phrase: what beyond plain attention it uses ("sliding window 4096 on 21 of 42 layers, ...")."""
        parts, n = [], len(self.layers)
        for w in sorted(set(self.windows.values())):
            count = sum(1 for v in self.windows.values() if v == w)
            parts.append(f"sliding window {w} on {count} of {n} layers")
        caps = sorted({layer.softcap for layer in self.layers if layer.softcap is not None})
        parts += [f"logit soft cap {c:g}" for c in caps]
        if any(layer.sinks for layer in self.layers):
            parts.append("learned attention sinks")
        return ", ".join(parts) or "plain attention"


def check_config(cfg: dict) -> None:
    """Refuse, from a config dict alone, a model whose attention the runtime does not implement."""
    kind = str(cfg.get("model_type") or "unknown")

    def refuse(what: str) -> None:
        raise UnsupportedModelError(f"model type {kind!r} is not supported: {what}")

    if cfg.get("is_encoder_decoder"):
        refuse("an encoder-decoder model (the runtime serves decoder-only causal LMs)")
    present = [key for key in MULTIMODAL_KEYS if cfg.get(key)]
    if present:
        refuse(f"a multimodal model ({present[0]}); the runtime feeds text only: load a text-only checkpoint")
    if _alibi(cfg):
        refuse("ALiBi position biases (the tree attention adds no bias to the scores)")
    if cfg.get("attention_chunk_size"):
        refuse(f"chunked attention (attention_chunk_size={cfg['attention_chunk_size']}) lives in the mask only")
    if cfg.get("use_bidirectional_attention"):
        refuse("bidirectional attention (use_bidirectional_attention); the tree attention is causal")
    other = sorted(set(cfg.get("layer_types") or ()) - set(SERVED_LAYER_TYPES))
    if other:
        refuse(f"layer types {', '.join(other)} (the tree attention serves {', '.join(SERVED_LAYER_TYPES)})")


def _alibi(cfg: dict) -> bool:
    attn = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), dict) else {}
    return bool(
        cfg.get("alibi")
        or attn.get("alibi")
        or cfg.get("position_embedding_type") == "alibi"
        or cfg.get("model_type") in ("bloom", "mpt")
    )


_PROBED: weakref.WeakKeyDictionary[torch.nn.Module, ModelAttention] = weakref.WeakKeyDictionary()


def model_attention(model: torch.nn.Module) -> ModelAttention:
    """What ``model``'s attention asks for, per layer; refuses a model the tree attention cannot serve.

    The first call per model probes it (one two-token forward); later calls return the cached result.
    Raises :class:`~arbor_runtime.errors.UnsupportedModelError` with one line.
    """
    if model not in _PROBED:
        _PROBED[model] = _probe(model)
    return _PROBED[model]


def check_policy(policy: object, attention: ModelAttention) -> None:
    """Refuse a sparse decode policy (lychee, quest, oracle_topk) for a model whose attention is not plain: its
    chunk retrieval and reads implement plain softmax attention only."""
    from arbor_runtime.policies.sparse import SparsePolicy

    if isinstance(policy, SparsePolicy) and not attention.plain:
        raise UnsupportedModelError(
            f"policy={getattr(policy, 'name', type(policy).__name__)}: sparse decode attention serves plain attention "
            f"only, and model type {attention.model_type!r} uses {attention.describe()}; use a memory policy "
            "(full, h2o, streaming, snapkv, thinkv, arbor, kvp)"
        )
    if getattr(policy, "granularity", "token") == "head" and attention.windows:
        raise UnsupportedModelError(
            f"policy={getattr(policy, 'name', type(policy).__name__)} granularity=head: model type "
            f"{attention.model_type!r} has sliding-window layers, which mask keys by their positions, and a "
            "per-head block's slots hold other tokens in each head; valid: granularity=token"
        )


def _probe(model: torch.nn.Module) -> ModelAttention:
    config = model.config
    kind = str(getattr(config, "model_type", None) or type(model).__name__)
    check_config(config.to_dict())
    if not getattr(type(model), "_supports_attention_backend", False):
        raise UnsupportedModelError(
            f"model type {kind!r} is not supported: its attention does not go through the transformers "
            "attention interface, so the tree attention cannot serve it"
        )
    probe = _Probe()
    ids = torch.ones(1, 2, dtype=torch.long, device=next(model.parameters()).device)
    try:
        with torch.inference_mode(), tree_attention(model, probe):
            model(
                input_ids=ids, position_ids=torch.arange(2, device=ids.device).unsqueeze(0), cache=probe, use_cache=True
            )
    except UnsupportedModelError:
        raise
    except Exception as exc:  # any model code that fails under the hook: one line, never a traceback
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UnsupportedModelError(
            f"model type {kind!r} is not supported: its forward fails under the tree attention "
            f"({type(exc).__name__}: {first})"
        ) from None
    layers = _check_calls(kind, config, KVShape.of(model), probe.calls)
    return ModelAttention(kind, layers)


class _Probe:
    """Stands in for a :class:`~arbor_runtime.attention.tree.TreeBatch`: records each layer's call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, AttentionCall, tuple, tuple]] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return key_states, value_states

    def attend(self, layer, query, key, value, call: AttentionCall) -> torch.Tensor:
        self.calls.append((layer, call, tuple(key.shape), tuple(value.shape)))
        r, hq, q, _ = query.shape  # the output has the values' head size (MLA's differs from the keys')
        return query.new_zeros(r, q, hq, value.shape[-1])


def _check_calls(kind: str, config, shape: KVShape, calls) -> tuple[LayerAttention, ...]:
    """Every layer called once, K/V of the pool's geometry, windows as the config declares them."""
    text = getattr(config, "text_config", None) or config
    n = shape.layers
    seen = [layer for layer, *_ in calls]
    if sorted(seen) != list(range(n)):
        missing = sorted(set(range(n)) - set(seen))
        what = (
            f"layers {_few(missing)} never call it" if missing else f"layers call it {len(seen)} times for {n} layers"
        )
        raise UnsupportedModelError(
            f"model type {kind!r} is not supported: not every layer is attention through the transformers "
            f"attention interface ({what}: linear-attention or state-space layers?)"
        )
    expected = _declared_windows(text, n)
    out = [LayerAttention()] * n
    for layer, call, kshape, vshape in calls:
        if (kshape[1], kshape[-1], vshape[1], vshape[-1]) != (shape.kv_heads, shape.head_dim) * 2:
            raise UnsupportedModelError(
                f"model type {kind!r} is not supported: layer {layer} has {kshape[1]} key heads of size {kshape[-1]} "
                f"and {vshape[1]} value heads of size {vshape[-1]}; the KV pool, sized from its config, holds "
                f"{shape.kv_heads} heads of size {shape.head_dim} for both"
            )
        if expected[layer] is not None and call.window != expected[layer]:
            raise UnsupportedModelError(
                f"model type {kind!r} is not supported: its config declares a sliding window of {expected[layer]} "
                f"on layer {layer} but the attention call carries {call.window} (the window lives in the mask only)"
            )
        out[layer] = LayerAttention(call.window, call.softcap, call.sinks is not None)
    return tuple(out)


def _declared_windows(text, n: int) -> list[int | None]:
    """The sliding window the config declares per layer (transformers' own rule: ``sliding_window``
    on the layers ``layer_types`` marks sliding, on every layer without ``layer_types``)."""
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    if not window or getattr(text, "use_sliding_window", True) is False:
        return [None] * n
    return [window if types is None or types[i] == "sliding_attention" else None for i in range(n)]


def _few(items: list[int]) -> str:
    return ", ".join(map(str, items[:6])) + (", ..." if len(items) > 6 else "")
