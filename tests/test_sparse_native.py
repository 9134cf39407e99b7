"""The CPU kernels of the sparse step (arbor_runtime/sparse/native.py): they compute what the torch path
computes (the gather then scaled_dot_product_attention; the float32 centroid table's scores), across
arenas, padding, head dims; the runtime decodes the same tokens with and without them; without a
compiler or with ``ARBOR_NATIVE=0`` the torch path stays.

The kernels build once per machine (about half a minute, cached under TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import LycheePolicy, QuestPolicy
from arbor_runtime.sparse import native
from arbor_runtime.sparse.tree import dequantize, quantize

PROMPT = " ".join(f"Line {i} says the value is {i * 7 % 13}." for i in range(60)) + "\nAnswer:"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def fake_pool(layers: int, heads: int, dim: int, caps: list[int], seed: int = 0):
    """A pool's shape and arenas (keys / values (L, H, cap, D) float32), arenas back to back from slot 0."""
    gen = torch.Generator().manual_seed(seed)
    arenas, base = [], 0
    for cap in caps:
        keys = torch.randn(layers, heads, cap, dim, generator=gen)
        arenas.append(SimpleNamespace(base=base, keys=keys, values=torch.randn(keys.shape, generator=gen)))
        base += cap
    shape = SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"))
    return SimpleNamespace(arenas=arenas, shape=shape, device=shape.device)


def reference(pool, layer: int, q, slots, valid, scale: float):
    """The torch path: every slot's K/V copied out of its arena, then masked SDPA."""

    def table(part):
        whole = torch.cat([getattr(a, part)[layer] for a in pool.arenas], dim=1)  # (H, total, D)
        return torch.stack([whole[h][slots[:, h].clamp(min=0)] for h in range(slots.shape[1])], 1)

    return F.scaled_dot_product_attention(q, table("keys"), table("values"), attn_mask=valid.unsqueeze(2), scale=scale)


@pytest.mark.parametrize("dim", [64, 16])  # the compiled head dim and the generic loop
def test_the_read_kernel_is_masked_attention_over_the_slots_across_arenas(dim):
    assert native.available(fake_pool(1, 1, dim, [4])), "the kernel did not build here"
    pool = fake_pool(layers=2, heads=3, dim=dim, caps=[300, 40, 25])
    gen = torch.Generator().manual_seed(1)
    r, h, s = 2, 3, 90
    slots = torch.randint(0, 365, (r, h, s), generator=gen)
    slots[0, 1, :10] = torch.arange(340, 350)  # the last arena
    valid = torch.rand(r, h, s, generator=gen) > 0.3
    slots[~valid] = -1  # padding as the step pads: never read
    q = torch.randn(r, h, 3, dim, generator=gen)
    got = native.gather_attend(pool, 1, q, slots, valid, 0.25)
    want = reference(pool, 1, q, slots, valid, 0.25)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.equal(got, native.gather_attend(pool, 0, q, slots, valid, 0.25))  # the layer's own K/V


def test_a_row_and_head_with_nothing_to_read_gets_zeros_and_a_slot_in_no_arena_is_refused():
    pool = fake_pool(layers=1, heads=2, dim=16, caps=[50])
    q = torch.randn(1, 2, 2, 16)
    slots = torch.arange(20).view(1, 1, 20).expand(1, 2, 20).contiguous()
    valid = torch.ones(1, 2, 20, dtype=torch.bool)
    valid[0, 1] = False
    out = native.gather_attend(pool, 0, q, slots, valid, 1.0)
    assert torch.equal(out[0, 1], torch.zeros(2, 16)) and out[0, 0].abs().sum() > 0
    slots[0, 0, 3] = 50  # past the only arena
    with pytest.raises(RuntimeError, match="slot 50 is in no arena"):
        native.gather_attend(pool, 0, q, slots, torch.ones(1, 2, 20, dtype=torch.bool), 1.0)


@pytest.mark.parametrize("dim", [64, 24])
def test_the_score_kernel_is_the_float_tables_best_query_head(dim):
    gen = torch.Generator().manual_seed(2)
    codes, scales = quantize(torch.randn(3, 500, dim, generator=gen), torch.int8)
    q = torch.randn(2, 3, 3, dim, generator=gen)
    assert native.scores_available(codes, scales, q)
    got = native.centroid_scores(codes, scales, q)
    want = torch.matmul(q, dequantize(codes, scales).transpose(-1, -2)).amax(2)  # (2, 3, 500)
    assert got.shape == (2, 3, 500) and torch.allclose(got, want, atol=1e-4, rtol=1e-5)
    strided = codes[:, ::2]  # a view (the index grows its tables: a layer is a slice)
    assert torch.allclose(native.centroid_scores(strided, scales[:, ::2], q), want[..., ::2], atol=1e-4, rtol=1e-5)
    assert not native.scores_available(codes.float(), None, q)
    assert not native.scores_available(codes, scales, q.double())


def grow(tiny, policy):
    rt = Runtime(tiny, policy=policy)
    root = rt.new_tree(PROMPT, seed=3)
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=6, temperature=1.0))
    out = [c for got in rt.expand_many([(k, 1) for k in kids], SamplingParams(max_new_tokens=12)) for c in got]
    return rt, out


@pytest.mark.parametrize("cls", [LycheePolicy, QuestPolicy])
def test_the_runtime_decodes_the_same_tree_with_and_without_the_kernels(tiny, cls, monkeypatch):
    """A sparse read (a tenth of the context, the tree's rows sharing blocks): the tokens are the torch
    path's and the log-probs agree to float rounding; the kernel path did run."""
    policy = dict(token_budget=24, token_share=0.0, dense_below=0, min_block_tokens=8)
    monkeypatch.setenv("ARBOR_NATIVE", "0")
    off_rt, off = grow(tiny, cls(**policy))
    assert off_rt.backend.sparse.native is False
    monkeypatch.setenv("ARBOR_NATIVE", "1")
    calls = []
    real = native.gather_attend
    monkeypatch.setattr(native, "gather_attend", lambda *a, **k: calls.append(1) or real(*a, **k))
    on_rt, on = grow(tiny, cls(**policy))
    assert on_rt.backend.sparse.native is True and calls
    assert on_rt.backend.sparse.stats.read_fraction < 0.5
    for a, b in zip(off, on, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_without_a_compiler_the_torch_path_stays_and_says_so_once(monkeypatch, caplog):
    import torch.utils.cpp_extension as ext

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failed", False)
    monkeypatch.setattr(ext, "load_inline", lambda **_: (_ for _ in ()).throw(RuntimeError("no c++ compiler")))
    pool = fake_pool(1, 1, 16, [4])
    with caplog.at_level("WARNING", logger=native.__name__):
        assert not native.available(pool) and not native.available(pool)
    assert [r.getMessage() for r in caplog.records].count(
        "sparse native kernel unavailable (no c++ compiler); using the torch gather"
    ) == 1


def test_off_cpu_or_another_dtype_or_switched_off_it_is_not_used(monkeypatch):
    pool = fake_pool(1, 1, 16, [4])
    assert native.available(pool)
    pool.shape.dtype = torch.bfloat16
    assert not native.available(pool)
    pool.shape.dtype = torch.float32
    for off in ("0", "false", "Off", "no"):
        monkeypatch.setenv("ARBOR_NATIVE", off)
        assert not native.available(pool)


def test_the_build_is_named_for_this_cpu():
    """-march=native code is cached per kind of CPU (a shared cache on a cluster holds one build each)."""
    tag = native.cpu_tag()
    assert tag == native.cpu_tag() and len(tag) == 10 and int(tag, 16) >= 0
    assert native.warm() and native._module.__name__ == f"arbor_sparse_native_{tag}"


def test_without_ninja_on_path_the_pip_packages_is_put_there(monkeypatch, tmp_path):
    """A venv used without activating it (its bin/ not on PATH, no system ninja): torch's build finds the
    ninja that the ``ninja`` dependency installed."""
    import shutil

    import ninja

    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("ninja") is None
    native._ninja_on_path()
    assert shutil.which("ninja") == str(Path(ninja.BIN_DIR) / "ninja")
    native._ninja_on_path()  # once there, PATH is left alone
    assert os.environ["PATH"] == f"{ninja.BIN_DIR}{os.pathsep}{tmp_path}"
