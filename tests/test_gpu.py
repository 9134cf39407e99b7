"""CUDA-only checks (skipped without CUDA; scripts/gpu_check.sh runs them on a device).

Exactness of the tree attention kernels against SDPA over the concatenated keys, in the model's
dtype; the runtime against a plain greedy loop; bit-identical offload / restore through the
pinned host pool; no host synchronization anywhere on the restore path. The models here are
random-weight Llamas driven by token ids, so nothing is loaded from disk.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.tiny_llama import tiny_llama

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.attention import cuda_kernel_for, installed_flash_attn, merge_partials
from arbor_runtime.kv import BlockKV, KVShape, KVStore
from arbor_runtime.kv.streams import CudaStreams
from arbor_runtime.policies import ArborPolicy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CUDA = torch.device("cuda")
TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def kernel(name: str, dtype: torch.dtype, head_dim: int):
    """The named kernel if this GPU and install select it for ``dtype`` (else skip)."""
    capability = torch.cuda.get_device_capability()
    flash = installed_flash_attn() if name == "flash_attn" else None
    if name == "flash_attn" and flash is None:
        pytest.skip("flash-attn is not installed (optional gpu extra)")
    chosen, fn = cuda_kernel_for(dtype, head_dim, capability, flash)
    if chosen != name:
        pytest.skip(f"{name} is not used for {dtype} on sm{capability[0]}{capability[1]} (chosen: {chosen})")
    return fn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["flash_attn", "torch_flash", "efficient"])
def test_pieces_merged_by_lse_match_sdpa_over_the_concatenation(name, dtype):
    fn = kernel(name, dtype, 128)
    gen = torch.Generator(device=CUDA).manual_seed(0)
    arena_k = torch.randn(2, 8, 4096, 128, device=CUDA, dtype=dtype, generator=gen)  # (L, H_kv, S, D) pool
    arena_v = torch.randn(arena_k.shape, device=CUDA, dtype=dtype, generator=gen)
    q = torch.randn(1, 8, 24, 128, device=CUDA, dtype=dtype, generator=gen)  # rows x groups x new tokens
    pieces, scale = [(100, 1100), (2000, 2037), (3000, 3900)], 128**-0.5
    out = lse = None
    for a, b in pieces:  # strided views of the pool, as the tree attention reads them
        o, s = fn(q, arena_k[1, :, a:b].unsqueeze(0), arena_v[1, :, a:b].unsqueeze(0), scale, False)
        assert o.dtype == dtype and s.dtype == torch.float32 and s.shape == (1, 8, 24)
        out, lse = (o.float(), s.float()) if out is None else merge_partials(out, lse, o, s)
    keys = torch.cat([arena_k[1, :, a:b] for a, b in pieces], dim=1).unsqueeze(0)
    values = torch.cat([arena_v[1, :, a:b] for a, b in pieces], dim=1).unsqueeze(0)
    ref = F.scaled_dot_product_attention(q.float(), keys.float(), values.float(), scale=scale)
    ref_lse = torch.logsumexp((q.float() @ keys.float().transpose(-1, -2)) * scale, dim=-1)
    sdpa = F.scaled_dot_product_attention(q, keys, values, scale=scale)  # the model's dtype, as transformers runs it
    assert (out - ref).abs().max() <= TOL[dtype]
    assert (out.to(dtype).float() - sdpa.float()).abs().max() <= 2 * TOL[dtype]
    assert (lse - ref_lse).abs().max() <= 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["flash_attn", "torch_flash", "efficient"])
def test_causal_kernel_matches_sdpa(name, dtype):
    fn = kernel(name, dtype, 64)
    gen = torch.Generator(device=CUDA).manual_seed(1)
    q, k, v = (torch.randn(3, 4, 50, 64, device=CUDA, dtype=dtype, generator=gen) for _ in range(3))
    out, lse = fn(q, k, v, 0.125, True)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, scale=0.125)
    assert (out.float() - ref).abs().max() <= TOL[dtype] and lse.shape == (3, 4, 50)


@pytest.fixture(scope="module")
def tiny_cuda():
    return tiny_llama(CUDA, torch.float32)


def greedy_reference(model, ids: list[int], n: int) -> list[int]:
    """Plain transformers, whole sequence each step, no cache: the exactness reference."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids], device=CUDA)).logits[0, -1].argmax()))
    return ids


def test_runtime_on_cuda_generates_what_plain_greedy_does(tiny_cuda):
    rt = Runtime(tiny_cuda)
    prompt = list(range(5, 40))
    node = rt.new_tree_ids(prompt)
    for _ in range(3):
        node = rt.expand(node, 1, SamplingParams(max_new_tokens=5, temperature=0.0, stop_at_eos=False))[0]
    ids = rt.path_token_ids(node)
    assert ids == greedy_reference(tiny_cuda.model, prompt, len(ids) - len(prompt))


@pytest.mark.parametrize("granularity", ["token", "head"])
def test_arbor_on_cuda_matches_full_through_rehydrations(tiny_cuda, granularity):
    """Spans offloaded through the pinned host pool come back bit-identical on CUDA, per head too."""
    params = SamplingParams(max_new_tokens=6, temperature=0.0, stop_at_eos=False)
    outs, rts = [], []
    for policy in ("full", ArborPolicy(budget_tokens=70, granularity=granularity)):
        rt = Runtime(tiny_cuda, policy=policy)
        assert isinstance(rt.store.host.streams, CudaStreams)
        root = rt.new_tree_ids(list(range(7, 37)))
        kids = rt.expand(root, 3, params)
        for kid in kids:
            rt.expand(kid, 2, params)
        rt.expand(kids[0].children[0], 1, params)
        rt.expand(kids[2], 1, params)
        outs.append([n.token_ids for n in rt.all_nodes.values()])
        rts.append(rt)
    assert outs[0] == outs[1]
    assert rts[1].metrics.rehydrations > 0 and rts[1].metrics.peak_device_tokens <= 70


def filled_store(capacity: int | None, sizes=(700, 1500, 300)):
    """A bf16 store shaped like a small Llama with random K/V blocks; returns it and the data."""
    shape = KVShape(layers=4, kv_heads=8, head_dim=128, dtype=torch.bfloat16, device=CUDA)
    store = KVStore(shape, capacity=capacity)
    data = {}
    gen = torch.Generator(device=CUDA).manual_seed(2)
    for bid, n in enumerate(sizes):
        extents = store.pool.alloc(n)
        store.put(bid, BlockKV.from_extents(extents, 0, None))
        k = torch.randn(4, 8, n, 128, device=CUDA, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(k.shape, device=CUDA, dtype=torch.bfloat16, generator=gen)
        store.pool.write(torch.cat([torch.arange(e.start, e.end) for e in extents]), k, v)
        data[bid] = (k, v)
    return store, data


def evict_some(store: KVStore, data) -> None:
    for bid, (k, _) in data.items():
        n = k.shape[2]
        store.apply(bid, torch.arange(0, n, 3), offload=True)  # two thirds leave
        store.apply(bid, torch.arange(0, n, 6), offload=True)  # more leave: merged into the span


@pytest.mark.parametrize("capacity", [3000, None])  # None: an unbounded pool of several arenas
def test_offload_and_restore_are_bit_identical_on_cuda(capacity):
    store, data = filled_store(capacity)
    evict_some(store, data)
    assert store.host._chunks[0].is_pinned() and store.host.tokens > 0
    for bid, (k, v) in data.items():
        idx, hk, hv = store.host.read(bid)
        assert torch.equal(hk, k[:, :, idx].cpu()) and torch.equal(hv, v[:, :, idx].cpu())
        n = k.shape[2]
        store.apply(bid, torch.arange(0, n, 2), offload=True)  # a partial restore
    store.prefetch()
    for bid, (k, v) in data.items():
        blk = store.get(bid)
        now_k, now_v = store.read(bid)
        assert torch.equal(now_k, k[:, :, blk.kept]) and torch.equal(now_v, v[:, :, blk.kept])
        store.apply(bid, torch.arange(blk.length), offload=True)  # all of it back
    store.prefetch()
    for bid, (k, v) in data.items():
        assert store.get(bid).whole and all(torch.equal(a, b) for a, b in zip(store.read(bid), (k, v), strict=True))
    assert store.host.tokens == 0 and store.host.slots.used == 0


def test_restore_path_never_synchronizes_the_host():
    """Planning restores, issuing them and attention's per-layer waits, under sync debug 'error'."""
    store, data = filled_store(3000)
    evict_some(store, data)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for bid, (k, _) in data.items():
            store.apply(bid, torch.arange(k.shape[2]), offload=True)  # restore only: plan and queue
        store.prefetch()  # copies start on the restore stream
        views = [
            store.pool.layer_view(layer, seg.extent)  # compute waits on events, per block and layer
            for layer in range(store.shape.layers)
            for bid in data
            for seg in store.get(bid).segments
        ]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert views and not store.prefetcher.tickets  # every layer waited for
    for bid, (k, v) in data.items():
        assert all(torch.equal(a, b) for a, b in zip(store.read(bid), (k, v), strict=True))


def test_a_restore_runs_under_compute_issued_after_it():
    """Compute queued after a restore is issued does not wait for it: the copy ends while compute
    that started before it ended is still running (they overlap; nothing was serialized)."""
    store, data = filled_store(3000, sizes=(3000,))
    store.apply(0, torch.tensor([0]), offload=True)
    store.host.streams = streams = CudaStreams(CUDA, timing=True)
    a = torch.randn(8192, 8192, device=CUDA, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    store.apply(0, torch.arange(3000), offload=True)
    store.prefetch()  # ~48 MB host -> device on the restore stream
    begin = streams.record("compute")
    for _ in range(30):  # tens of ms of compute that does not read the restored block
        a = a @ a.T / 8192
    end = streams.record("compute")
    torch.cuda.synchronize()
    restore_end = streams._restores[0][1][-1]
    assert 0 < begin.elapsed_time(restore_end) < begin.elapsed_time(end)
    k, v = data[0]
    assert all(torch.equal(x, y) for x, y in zip(store.read(0), (k, v), strict=True))
