"""Attention kernels: attention over one key set with its log-sum-exp, and the softmax mass per key.

Kernels (all return ``(out, lse)`` and read strided pool views without copying), chosen per
call from the device, the dtype and the head size:

- CPU: ``aten::_scaled_dot_product_flash_attention_for_cpu``.
- CUDA, fp16/bf16 (the model's dtype), head size a multiple of 8 up to 256, compute capability
  8.0+: ``flash_attn.flash_attn_func`` when the optional ``gpu`` extra is installed (imported
  lazily, never required), else torch's own flash kernel ``aten::_scaled_dot_product_flash_attention``.
- CUDA otherwise (fp32, odd head sizes, older GPUs): the memory-efficient kernel
  ``aten::_scaled_dot_product_efficient_attention`` with ``compute_log_sumexp``.

The aten ops are private, so they are feature-detected; a matmul fallback (keys in chunks,
merged with the same function) is always available and tested.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from arbor_runtime.attention.merge import merge_partials

#: key / query tile sizes of the fallback kernel and of the statistics pass (bounded scratch)
KEY_CHUNK = 1024
QUERY_CHUNK = 512


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool = False,
    softcap: float | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Matmul attention with its log-sum-exp, keys in chunks of KEY_CHUNK merged exactly.

    q: (B, H, M, D); k, v: (B, H, N, D). Causal aligns the last query with the last key.
    softcap: scores become ``softcap * tanh(score / softcap)`` before the softmax (Gemma2).
    mask: bool, broadcastable to (B, H, M, N): True where a query sees a key (a sliding window).
    Returns out (B, H, M, D) float32 and lse (B, H, M) float32; a query that sees no key gets
    out 0 and lse -inf (it adds nothing when merged).
    """
    m, n = q.shape[-2], k.shape[-2]
    out = lse = None
    for c in range(0, n, KEY_CHUNK):
        kc, vc = k[..., c : c + KEY_CHUNK, :].float(), v[..., c : c + KEY_CHUNK, :].float()
        scores = capped_scores(q, kc, scale, softcap)  # (B, H, M, n_c)
        if causal:
            qpos = torch.arange(m, device=q.device).unsqueeze(1) + (n - m)
            kpos = torch.arange(c, c + kc.shape[-2], device=q.device).unsqueeze(0)
            scores = scores.masked_fill(kpos > qpos, float("-inf"))
        if mask is not None:
            scores = scores.masked_fill(~mask[..., c : c + KEY_CHUNK], float("-inf"))
        s = torch.logsumexp(scores, dim=-1)
        o = torch.matmul(torch.softmax(scores, dim=-1).nan_to_num_(0.0), vc)
        out, lse = (o, s) if out is None else merge_partials(out, lse, o, s)
    return out, lse


def capped_scores(q: torch.Tensor, k: torch.Tensor, scale: float, softcap: float | None = None) -> torch.Tensor:
    """(..., M, D) x (..., N, D) -> (..., M, N) float32 scores ``scale q.k``, soft-capped when asked
    (``softcap * tanh(s / softcap)``, Gemma2's order: scale first, then the cap)."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores


KernelFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _cpu_flash(q, k, v, scale, causal):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse


def _cuda_efficient(q, k, v, scale, causal):
    """Memory-efficient SDPA kernel; its lse is padded to a multiple of 32 queries."""
    ops = torch.ops.aten
    out, lse, _, _ = ops._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
    return out, lse.narrow(-1, 0, q.shape[-2])


def _cuda_torch_flash(q, k, v, scale, causal):
    """torch's built-in FlashAttention-2 (fp16/bf16): out (B, H, M, D), lse (B, H, M) float32."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    return out, lse


def flash_attn_kernel(flash_attn_func: Callable) -> KernelFn:
    """Wrap ``flash_attn.flash_attn_func`` (layout (B, M, H, D)) as an (out, lse) kernel in (B, H, M, D)."""

    def kernel(q, k, v, scale, causal):
        out, lse, _ = flash_attn_func(
            q.transpose(1, 2),
            k.transpose(1, 2),  # strided pool views: only the last dim has to be contiguous
            v.transpose(1, 2),
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            return_attn_probs=True,
        )
        return out.transpose(1, 2), lse

    return kernel


def installed_flash_attn() -> Callable | None:
    """``flash_attn.flash_attn_func`` if the optional package imports, else None."""
    try:
        return importlib.import_module("flash_attn").flash_attn_func
    except (ImportError, AttributeError, OSError):  # absent, or built for another torch / CUDA
        return None


def cuda_kernel_for(
    dtype: torch.dtype, head_dim: int, capability: tuple[int, int], flash_attn_func: Callable | None = None
) -> tuple[str, KernelFn | None]:
    """(name, kernel) the CUDA path uses for this dtype, head size and compute capability."""
    ops = torch.ops.aten
    flash_fits = dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256
    if flash_fits and capability >= (8, 0):
        if flash_attn_func is not None:
            return "flash_attn", flash_attn_kernel(flash_attn_func)
        if hasattr(ops, "_scaled_dot_product_flash_attention"):
            return "torch_flash", _cuda_torch_flash
    if hasattr(ops, "_scaled_dot_product_efficient_attention"):
        return "efficient", _cuda_efficient
    return "reference", None


class CudaKernels:
    """Picks the CUDA kernel per (dtype, head size) on first use and remembers the choice."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.chosen: dict[tuple[torch.dtype, int], tuple[str, KernelFn | None]] = {}

    def choice(self, dtype: torch.dtype, head_dim: int) -> tuple[str, KernelFn | None]:
        key = (dtype, head_dim)
        if key not in self.chosen:
            capability = torch.cuda.get_device_capability(self.device)
            self.chosen[key] = cuda_kernel_for(dtype, head_dim, capability, installed_flash_attn())
        return self.chosen[key]

    def __call__(self, q, k, v, scale, causal):
        _, fn = self.choice(q.dtype, q.shape[-1])
        if fn is None:
            return attention_reference(q, k, v, scale, causal)
        return fn(q, k, v, scale, causal)


def _fast_kernel(device: torch.device):
    """The fused (out, lse) kernel for a device, or None when this torch build lacks it."""
    if device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return _cpu_flash
    if device.type == "cuda":
        return CudaKernels(device)
    return None


def _cpu_flash_masked(q, k, v, scale, mask):
    """The fused CPU kernel with a visibility mask (an additive 0 / -inf bias in the query dtype). It
    reports lse 0 for a query that sees no key: set to -inf here so the merge ignores it."""
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=bias, scale=scale
    )[:2]
    blind = ~mask.any(dim=-1)  # (.., M) broadcast over (B, H, M)
    if bool(blind.any()):
        lse = lse.masked_fill(blind, float("-inf"))
    return out, lse


class Kernel:
    """Attention with log-sum-exp: the fused op when available (``use_fast``), else the reference.

    A soft cap runs the reference (no fused kernel here caps scores). A mask runs the fused CPU kernel
    with an additive bias, the reference elsewhere (CUDA: correct, not fast; only the few pieces a
    sliding window cuts through take it).
    """

    def __init__(self, device: torch.device, use_fast: bool = True) -> None:
        self.fast = _fast_kernel(device) if use_fast else None

    def __call__(
        self,
        q,
        k,
        v,
        scale: float,
        causal: bool = False,
        softcap: float | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (B, H, M, D); k, v: (B, H, N, D), strided views allowed; mask: bool broadcastable to
        (B, H, M, N), True = seen. Returns (out, lse); a query that sees no key has lse -inf."""
        if softcap is None and mask is not None and self.fast is _cpu_flash and not causal:
            return _cpu_flash_masked(q, k, v, scale, mask)
        if softcap is None and mask is None and self.fast is not None:
            return self.fast(q, k, v, scale, causal)
        return attention_reference(q, k, v, scale, causal, softcap, mask)

    def name(self, dtype: torch.dtype, head_dim: int) -> str:
        """Which kernel runs for this dtype and head size (for reports)."""
        if isinstance(self.fast, CudaKernels):
            return self.fast.choice(dtype, head_dim)[0]
        return "reference" if self.fast is None else "cpu_flash"


def attention_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    causal: bool = False,
    softcap: float | None = None,
    mask: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax mass each key receives, summed over batch, heads and queries, in bounded tiles.

    Args:
        q: (B, H, M, D); k: (B, H, N, D); lse: (B, H, M) the queries' final log-sum-exp over
            *all* keys they attend (so masses over a partial key set are true probabilities).
        causal: query i (of M) sees key j only if j <= i + N - M.
        softcap: the scores' soft cap, as in attention; mask: (M, N) bool, True = seen (a window).
        out: (N,) float32 to add the masses to (nothing of size N is allocated then), or (B*H, N)
            to keep them per batch entry and head (summed over queries only); None: a new (N,) one.
    Returns:
        (N,) or (B*H, N) float32: ``out`` when given.

    Each tile is one ``baddbmm`` (``-lse + (scale q) k^T``), an in-place ``exp`` and a sum; only a
    tile the causal diagonal crosses is masked (a prefill's statistics cost about as much as its
    attention instead of twice as much). A soft cap computes the capped scores of the tile instead. One
    tile, at most B*H x QUERY_CHUNK x KEY_CHUNK floats, is alive at a time.
    """
    m, n = q.shape[-2], k.shape[-2]
    lead = q.shape[:-2]
    mass = torch.zeros(n, dtype=torch.float32, device=q.device) if out is None else out
    qs = (q.float() * scale).reshape(-1, m, q.shape[-1])  # (BH, M, D)
    ks = k.float().reshape(-1, n, k.shape[-1])  # (BH, N, D)
    neg_lse = lse.float().reshape(-1, m, 1).neg()  # (BH, M, 1)
    if ks.shape[0] != qs.shape[0]:  # k broadcast over the batch (one key set for every row)
        ks = k.float().expand(*lead, n, k.shape[-1]).reshape(-1, n, k.shape[-1])
    for r in range(0, m, QUERY_CHUNK):
        rows = min(QUERY_CHUNK, m - r)
        last_key = r + rows - 1 + n - m  # the tile's last query sees keys up to this one (causal)
        seen = min(n, last_key + 1) if causal else n
        for c in range(0, seen, KEY_CHUNK):
            cols = min(KEY_CHUNK, seen - c)
            kt = ks[:, c : c + cols].transpose(1, 2)
            if softcap is None:
                p = torch.baddbmm(neg_lse[:, r : r + rows], qs[:, r : r + rows], kt)
            else:
                p = torch.tanh(torch.bmm(qs[:, r : r + rows], kt) / softcap) * softcap + neg_lse[:, r : r + rows]
            if causal and c + cols - 1 > r + n - m:  # the diagonal crosses this tile
                qpos = torch.arange(r, r + rows, device=q.device).unsqueeze(1) + (n - m)
                kpos = torch.arange(c, c + cols, device=q.device).unsqueeze(0)
                p.masked_fill_(kpos > qpos, float("-inf"))
            if mask is not None:
                p.masked_fill_(~mask[r : r + rows, c : c + cols], float("-inf"))
            if mass.dim() == 2:  # per head: (BH, cols)
                mass[:, c : c + cols] += p.exp_().sum(dim=1)
            else:
                mass[c : c + cols] += p.exp_().sum(dim=(0, 1))
            del p  # freed before the next tile is made
    return mass
