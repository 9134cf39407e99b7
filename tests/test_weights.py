"""Linear weights a CPU reads fast (issue 64): int8 and int4 weight-only on PyTorch's CPU kernels.

The int4 weights of a GGUF model are its own Q4_1 blocks (dequantized, they equal transformers' float32 read
of the same file exactly); an int4 or int8 layer computes what a dense layer over the same weights computes,
to bfloat16 rounding; a quantized model runs through the runtime; formats a device or a dtype cannot take
are refused in one line, before any weight loads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from arbor_runtime import Runtime, SamplingParams, load_model
from arbor_runtime import weights as weight_formats
from arbor_runtime.loading import auto_weights, inspect_model, resolve_weights
from arbor_runtime.policies.kvp_weights import model_fingerprint
from arbor_runtime.weights import GROUP, Int4Linear, Int8Linear, q4_1_blocks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def close_to_dense(layer: nn.Module, weight: torch.Tensor, rel: float) -> None:
    """``layer`` computes ``x W^T`` of the bfloat16-rounded input to within ``rel`` of the output's scale."""
    x = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
    want = x.bfloat16().float() @ weight.T
    got = layer(x)
    assert got.shape == want.shape and got.dtype == x.dtype
    assert float((got - want).abs().max()) <= rel * float(want.abs().max()), float((got - want).abs().max())


def test_q4_1_blocks_decode_as_llama_cpp_writes_them():
    """Two hand-written blocks: d, m as float16, then 16 bytes whose low nibbles are codes 0-15 and high
    nibbles codes 16-31."""
    rows = []
    for d, m, codes in ((0.5, -1.0, np.arange(32) % 16), (0.25, 2.0, (31 - np.arange(32)) % 16)):
        head = np.array([d, m], dtype=np.float16).view(np.uint8)
        nibbles = (codes[:16] | (codes[16:] << 4)).astype(np.uint8)
        rows.append(np.concatenate([head, nibbles]))
    codes, d, m = q4_1_blocks(np.stack(rows))
    assert codes.tolist() == [list(np.arange(32) % 16), list((31 - np.arange(32)) % 16)]
    assert d.tolist() == [[0.5], [0.25]] and m.tolist() == [[-1.0], [2.0]]


def test_int4_from_codes_computes_d_times_q_plus_m():
    codes = torch.randint(0, 16, (48, 64), generator=torch.Generator().manual_seed(1))
    d = torch.rand(48, 64 // GROUP, generator=torch.Generator().manual_seed(2)) * 0.1
    m = -torch.rand(48, 64 // GROUP, generator=torch.Generator().manual_seed(3))
    weight = (codes.float().reshape(48, -1, GROUP) * d[..., None] + m[..., None]).reshape(48, 64)
    close_to_dense(Int4Linear.from_codes(codes, d, m), weight, rel=0.02)


@pytest.mark.parametrize("layer", [Int8Linear, Int4Linear.from_weight])
def test_quantized_layers_compute_the_dense_product_to_rounding(layer):
    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(4)) * 0.05
    quantized = layer(weight)
    rel = 0.03 if isinstance(quantized, Int8Linear) else 0.15  # 255 levels a channel, 16 a group
    close_to_dense(quantized, weight, rel)


@pytest.mark.parametrize("layer", [Int8Linear, Int4Linear.from_weight])
def test_a_batch_multiplies_by_the_bfloat16_copy_and_a_few_rows_by_the_kernel(layer):
    """From BATCH_ROWS rows on a layer with a copy computes with it (the kernels' own weights in bfloat16: the
    kernel's product to bfloat16 rounding); below it, bit for bit what the layer without a copy computes."""
    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(5)) * 0.05
    plain, copied = layer(weight), layer(weight, batch_copy=True)
    assert plain.batch_weight is None and copied.batch_weight.dtype == torch.bfloat16
    few = torch.randn(weight_formats.BATCH_ROWS - 1, 96, generator=torch.Generator().manual_seed(6))
    assert torch.equal(copied(few), plain(few))
    many = torch.randn(3, weight_formats.BATCH_ROWS, 96, generator=torch.Generator().manual_seed(7))
    want, got = plain(many), copied(many)
    assert got.shape == want.shape == (3, weight_formats.BATCH_ROWS, 64)
    assert float((got - want).abs().max()) <= 0.02 * float(want.abs().max())
    used = []
    copied.batch_weight = copied.batch_weight.clone()
    original = nn.functional.linear
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nn.functional, "linear", lambda *a, **k: used.append(1) or original(*a, **k))
        copied(many), copied(few)
    assert used == [1]  # the batch alone went through the copy


def test_the_copy_is_kept_where_bfloat16_is_native_and_it_fits(monkeypatch):
    model = nn.Sequential(nn.Linear(96, 64), nn.Linear(64, 32))
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert weight_formats.keeps_batch_copy(model) is native
    monkeypatch.setattr(weight_formats, "BATCH_COPY_MAX_BYTES", 2 * (96 * 64 + 64 * 32) - 1)  # a byte short
    assert not weight_formats.keeps_batch_copy(model)
    monkeypatch.setattr(weight_formats, "BATCH_COPY_MAX_BYTES", 2 << 30)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not weight_formats.keeps_batch_copy(model)


def test_smollm2_int4_keeps_the_gguf_blocks_exactly(smollm2):
    """The int4 weights of the shipped GGUF are its own blocks: decoded, each equals transformers' float32."""
    from arbor_runtime.loading import smollm2_gguf_path
    from arbor_runtime.weights import gguf_blocks

    blocks = gguf_blocks(smollm2_gguf_path(), smollm2.model.config)
    modules = dict(smollm2.model.named_modules())
    assert len(blocks) == 7 * smollm2.model.config.num_hidden_layers
    for name, (codes, d, m) in blocks.items():
        dense = modules[name].weight.detach()
        decoded = (codes.float().reshape(codes.shape[0], -1, GROUP) * d[..., None] + m[..., None]).reshape(dense.shape)
        assert torch.equal(decoded, dense), name


def test_a_quantized_tiny_model_runs_through_the_runtime_and_keeps_its_fingerprint(tiny):
    dense_fp = model_fingerprint(tiny.model)
    for weights in ("int8", "int4"):
        loaded = load_model("tiny-random", device="cpu", weights=weights)
        assert loaded.weights == weights and model_fingerprint(loaded.model) == dense_fp
        layer = loaded.model.model.layers[0]
        assert isinstance(layer.mlp.up_proj, Int8Linear if weights == "int8" else Int4Linear)
        assert isinstance(loaded.model.get_output_embeddings(), Int8Linear)
        rt = Runtime(loaded, policy="arbor", budget_tokens=400)
        assert rt.backend.shape.dtype == torch.bfloat16
        root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
        kids = rt.expand(root, 3, SamplingParams(max_new_tokens=12, temperature=1.0, seed=0, stop_at_eos=False))
        assert all(k.length == 12 for k in kids) and rt.store.resident_tokens <= 400


@pytest.mark.parametrize(
    ("weights", "device", "dtype", "said"),
    [
        ("int3", "cpu", None, "weights='int3' is not a weight format; valid: dense, int8, int4, auto"),
        ("int4", "cpu", "float32", "dtype=float32 with weights=int4: int8 and int4 weights compute in bfloat16"),
        ("int8", "cpu", "float16", "dtype=float16 with weights=int8"),
    ],
)
def test_a_format_or_dtype_that_cannot_run_is_one_line(weights, device, dtype, said):
    with pytest.raises(ValueError, match=rf"^{said}"):
        resolve_weights(weights, "tiny-random", device, dtype)
    with pytest.raises(ValueError, match=rf"^{said}"):
        inspect_model("tiny-random", device=device, dtype=dtype, weights=weights)


def test_a_quantized_format_off_cpu_is_refused(monkeypatch):
    from arbor_runtime import weights

    with pytest.raises(ValueError, match=r"weights=int4 runs on CPU kernels .* valid: weights=dense there"):
        weights.check_weights("int4", "cuda")


def test_auto_is_int4_for_the_gguf_on_cpu_and_dense_elsewhere():
    assert auto_weights("smollm2", "cpu") == "int4"
    assert auto_weights("smollm2", "cpu", "float32") == "dense"  # a dtype asked for keeps the weights dense
    assert auto_weights("tiny-random", "cpu") == "dense"
    assert auto_weights("smollm2", "cuda") == "dense"
    assert inspect_model("tiny-random", device="cpu", weights="int4").dtype_bytes == 2  # bfloat16 KV


def test_the_cli_records_the_weights_in_each_row(data_dir, tmp_path):
    import json

    from rich.console import Console

    from arbor_cli.build import compose_config
    from arbor_cli.run import run

    argv = ["model=tiny-random", "model.weights=int8", f"paths.data_dir={data_dir}", f"run_dir={tmp_path}"]
    assert run(compose_config([*argv, "task.end=901"]), Console(quiet=True)) == 0
    assert json.loads((tmp_path / "results.jsonl").read_text())["weights"] == "int8"
