"""The scratch bound: what one forward may allocate on the device beyond the KV pool.

Device memory during a forward is the weights, the pool (exactly ``budget_tokens`` slots, allocated
once) and the forward's scratch. The scratch is held to a bound that grows with the batch's rows x
new tokens and never with its context (the tokens its rows read from the pool):

    scratch <= R*k*V*s                                         logits
             + R*q*(s*(4*H + 4*I) + 4*Hq*(8*D + C))             one decoder layer, attention partials
             + R*n*(2*Hkv*D*s + 12*Hq*q)                       own tokens (decode): K/V gathered, scores
             + min(R*g*q, 256) * T * 4*(514 + D)                the CPU flash kernel's per-thread tiles
             + P                                                one packed copy (2*Hkv*D*s*PACK_MAX_TOKENS)

R rows, q new tokens per row, k logits kept per row (1, or q for a forced block), n a decode row's
own tokens read from the pool (at most its ``max_new_tokens``; 0 in a prefill). From the model: V
vocabulary, H hidden size, I intermediate size, Hq / Hkv query / KV heads, g = Hq / Hkv, D head
size, s bytes of the model's dtype; T torch threads (CPU). C is KEY_CHUNK (1,024) when attention
statistics are collected (one score tile of rows x new tokens x query heads x KEY_CHUNK keys at a
time), else 0. P is there when a block's kept tokens lie in short runs that are read as one copy.

The coefficients are upper bounds counted from the code: a decoder layer's live activations (the
residual stream, the normed input, the MLP's gate, up, activation and product), the float32
gathered queries, partial outputs, log-sum-exps and merge copies of the tree attention, and the
flash kernel's buffer (``qSplitSize x kvSplitSize + 2 x qSplitSize + qSplitSize x D`` floats per
thread, qSplitSize <= 256, kvSplitSize <= 512). ``tests/test_scratch.py`` measures every forward of
every policy at the widest expansion the CLI runs (the allocator's own events, through torch's
profiler) and holds it to this bound. Beside the forward, a batch with statistics holds one float32
per context slot it reads (the masses each key received): at most 4 x ``budget_tokens`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.attention.kernels import KEY_CHUNK
from arbor_runtime.attention.tree import PACK_MAX_TOKENS

#: the CPU flash kernel's query tile rows at most and key tile columns at most (aten FlashAttentionKernel)
FLASH_Q_SPLIT, FLASH_KV_SPLIT = 256, 512


@dataclass(frozen=True, slots=True)
class ScratchModel:
    """The model sizes the bound reads (see the module docstring for the letters)."""

    vocab: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ScratchModel:
        cfg = model.config
        cfg = getattr(cfg, "text_config", None) or cfg
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        size = next(model.parameters()).element_size()
        intermediate = int(getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size)
        return cls(int(cfg.vocab_size), int(cfg.hidden_size), intermediate, heads, kv_heads, head_dim, size)


def forward_scratch_bytes(
    m: ScratchModel,
    rows: int,
    q: int,
    own: int = 0,
    logits: int = 1,
    stats: bool = False,
    packed: bool = True,
    threads: int | None = None,
) -> int:
    """The bound on one forward's scratch, in bytes (the formula of the module docstring).

    Args:
        rows / q: R rows of q new tokens; own: n, a decode row's own tokens read from the pool;
        logits: k, logits kept per row; stats: attention statistics collected; packed: a packed
        copy may be made; threads: T (default: torch's threads now).
    """
    return logits_scratch_bytes(m, rows, logits) + body_scratch_bytes(m, rows, q, own, stats, packed, threads)


def logits_scratch_bytes(m: ScratchModel, rows: int, logits: int = 1) -> int:
    """The bound's logits term: ``R*k*V*s``, what the output layer allocates at the forward's end."""
    return rows * logits * m.vocab * m.dtype_bytes


def body_scratch_bytes(
    m: ScratchModel,
    rows: int,
    q: int,
    own: int = 0,
    stats: bool = False,
    packed: bool = True,
    threads: int | None = None,
) -> int:
    """The bound less its logits term: what the layer stack (attention over the context included) may
    allocate before the output layer runs. A copy of the context it reads (rows x context x K/V) does
    not fit it, whatever the logits would have hidden."""
    s, f = m.dtype_bytes, 4
    threads = torch.get_num_threads() if threads is None else threads
    chunk = KEY_CHUNK if stats else 0
    layer = rows * q * (s * (4 * m.hidden + 4 * m.intermediate) + f * m.heads * (8 * m.head_dim + chunk))
    own_tokens = rows * own * (2 * m.kv_heads * m.head_dim * s + f * m.heads * q * 3)
    group = m.heads // m.kv_heads
    flash = min(rows * group * q, FLASH_Q_SPLIT) * threads * f * (FLASH_KV_SPLIT + 2 + m.head_dim)
    pack = 2 * m.kv_heads * m.head_dim * s * PACK_MAX_TOKENS if packed else 0
    return layer + own_tokens + flash + pack
