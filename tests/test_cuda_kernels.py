"""The CUDA attention kernels, checked on the CPU: selection by dtype / head size / capability,
and each op's signature and output layout on fake CUDA tensors (torch's FakeTensorMode runs the
ops' shape and device logic without a GPU). Values on a GPU: tests/test_gpu.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from arbor_runtime.attention import attention_reference, cuda_kernel_for, flash_attn_kernel

H100 = (9, 0)


def reference_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, return_attn_probs):
    """Stand-in for flash_attn.flash_attn_func: (B, M, H, D) layout in, (out, lse (B, H, M), None) out."""
    assert dropout_p == 0.0 and return_attn_probs and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    out, lse = attention_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale, causal)
    return out.transpose(1, 2).to(q.dtype), lse, None


@pytest.mark.parametrize(
    ("dtype", "head_dim", "capability", "flash_pkg", "expected"),
    [
        (torch.bfloat16, 128, H100, True, "flash_attn"),
        (torch.bfloat16, 128, H100, False, "torch_flash"),
        (torch.float16, 64, (8, 0), False, "torch_flash"),
        (torch.bfloat16, 128, (7, 5), True, "efficient"),  # pre-Ampere: no flash
        (torch.bfloat16, 20, H100, True, "efficient"),  # head size not a multiple of 8
        (torch.float32, 128, H100, True, "efficient"),  # flash kernels are fp16/bf16 only
    ],
)
def test_cuda_kernel_selection(dtype, head_dim, capability, flash_pkg, expected):
    name, fn = cuda_kernel_for(dtype, head_dim, capability, reference_flash_attn_func if flash_pkg else None)
    assert name == expected and fn is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_kernels_take_strided_pool_views_and_return_lse_per_query(dtype, causal):
    """On fake CUDA tensors: keys have the strides of a (1, H, n, D) view of a (L, H, S, D) arena,
    as attention reads them; out must be (1, H, M, D) in the model dtype and lse (1, H, M) float32."""
    name, fn = cuda_kernel_for(dtype, 64, H100)
    pool_view = (4 * 300 * 64, 300 * 64, 64, 1)  # arena[layer, :, a:b].unsqueeze(0) of a (2, 4, 300, 64) arena
    with FakeTensorMode(allow_non_fake_inputs=True):
        m = 37 if not causal else 40
        q = torch.empty(1, 4, m, 64, device="cuda", dtype=dtype)
        k = torch.empty_strided((1, 4, 40, 64), pool_view, device="cuda", dtype=dtype)
        v = torch.empty_strided((1, 4, 40, 64), pool_view, device="cuda", dtype=dtype)
        out, lse = fn(q, k, v, 0.125, causal)
        assert out.shape == (1, 4, m, 64) and out.dtype == dtype and out.device.type == "cuda"
        assert lse.shape == (1, 4, m) and lse.dtype == torch.float32 and lse.device.type == "cuda"
    assert name == ("efficient" if dtype == torch.float32 else "torch_flash")


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_wrapper_transposes_layouts_and_keeps_lse(causal):
    """The flash-attn wrapper (layout (B, M, H, D) inside) equals the reference in (B, H, M, D),
    on strided pool views, with real values (a CPU stand-in for the package's function)."""
    gen = torch.Generator().manual_seed(0)
    arena = torch.randn(2, 3, 50, 8, generator=gen)
    k, v = arena[0, :, 10:30].unsqueeze(0), arena[1, :, 10:30].unsqueeze(0)
    q = torch.randn(1, 3, 20, 8, generator=gen)
    out, lse = flash_attn_kernel(reference_flash_attn_func)(q, k, v, 0.3, causal)
    ref_out, ref_lse = attention_reference(q, k, v, 0.3, causal)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert torch.allclose(out, ref_out, atol=1e-6) and torch.allclose(lse, ref_lse, atol=1e-6)
