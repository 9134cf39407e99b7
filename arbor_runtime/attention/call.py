"""What one attention layer asks of the tree attention: read from the transformers attention interface.

A model's attention layer calls ``attention_interface(module, query, key, value, mask, **kwargs)``.
The keyword arguments carry what the layer's softmax is (transformers 5.x, read from the modeling
files of each family): ``scaling``; ``sliding_window`` (Mistral, Phi3, Qwen2/3 sliding layers,
Gemma2/3 local layers, gpt-oss; a key is seen when ``q_pos - k_pos < sliding_window``, the
flash-attn ``window_size=(w - 1, w - 1)`` of ``modeling_flash_attention_utils``); ``softcap``
(Gemma2: ``cap * tanh(score / cap)`` before the softmax); ``s_aux`` (gpt-oss: one learned sink
logit per query head that joins the softmax's denominator with no value); ``dropout`` (0 outside
training). :func:`attention_call` turns them into an :class:`AttentionCall`; anything else that
could change the result is refused with one line naming the model type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.errors import UnsupportedModelError

#: keyword arguments that change nothing in the attention itself (positions come in through RoPE,
#: the cache is the batch, MoE routers and output flags are the layer's own business)
INERT_KWARGS = frozenset(
    {
        "position_ids",
        "cache_position",
        "use_cache",
        "past_key_values",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "return_dict",
    }
)
#: what :class:`AttentionCall` implements (and is read from), for messages
IMPLEMENTED = ("scaling", "sliding_window", "softcap", "s_aux (sinks)", "dropout=0")


@dataclass(frozen=True, slots=True)
class AttentionCall:
    """The softmax one layer asks for.

    Attributes:
        scale: multiplies ``q . k`` (transformers' ``scaling``).
        window: sliding window: a query at position p sees keys at positions > p - window (their
            original positions, whatever was evicted); None = every earlier key.
        softcap: scores become ``softcap * tanh(score / softcap)`` before the softmax; None = off.
        sinks: (Hq,) learned sink logits (gpt-oss ``s_aux``): each query head's softmax has an extra
            term ``exp(sink)`` in its denominator and no value; None = off.
    """

    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        """Plain scaled softmax attention (what any fused kernel computes)."""
        return self.window is None and self.softcap is None and self.sinks is None


def model_type(module: torch.nn.Module) -> str:
    """The model type an attention module belongs to, for messages (its class name without a config)."""
    config = getattr(module, "config", None)
    return str(getattr(config, "model_type", None) or type(module).__name__)


def attention_call(module: torch.nn.Module, query: torch.Tensor, kwargs: dict) -> AttentionCall:
    """The :class:`AttentionCall` of one layer's keyword arguments; refuses what it cannot serve.

    Args:
        module: the attention layer; query: (R, Hq, q, D); kwargs: what the layer passed besides the mask.
    Raises:
        UnsupportedModelError: one line naming the model type and the argument.
    """
    unknown = sorted(k for k, v in kwargs.items() if v is not None and k not in INERT_KWARGS | _READ)
    if unknown:
        raise UnsupportedModelError(
            f"model type {model_type(module)!r}: its attention passes {', '.join(unknown)}, which the tree "
            f"attention does not implement (it implements {', '.join(IMPLEMENTED)})"
        )
    if kwargs.get("is_causal") is False:
        raise UnsupportedModelError(f"model type {model_type(module)!r}: non-causal attention is not supported")
    if float(kwargs.get("dropout") or 0.0) != 0.0:
        raise UnsupportedModelError(
            f"model type {model_type(module)!r}: attention dropout {kwargs['dropout']} (a model in training "
            "mode); the runtime serves models in eval mode"
        )
    scaling = kwargs.get("scaling")
    return AttentionCall(
        scale=float(scaling) if scaling is not None else query.shape[-1] ** -0.5,
        window=_window(module, kwargs.get("sliding_window")),
        softcap=float(kwargs["softcap"]) if kwargs.get("softcap") is not None else None,
        sinks=kwargs.get("s_aux"),
    )


#: keyword arguments :func:`attention_call` reads
_READ = frozenset({"scaling", "sliding_window", "softcap", "s_aux", "dropout", "is_causal"})


def _window(module: torch.nn.Module, value) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UnsupportedModelError(
            f"model type {model_type(module)!r}: sliding_window={value!r} is not a positive number of tokens"
        )
    return value
