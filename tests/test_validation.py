"""Bad input is refused before the model loads: one line `arbor-solve: error: ...`, exit 2, no traceback.

Every case runs through :func:`arbor_cli.run.run` on a composed config (a few through the console
script) with the model loaders replaced by one that fails the test, so "before the model loads" is
what is asserted, not assumed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import arbor_cli.build
from arbor_cli import solve
from arbor_cli.build import compose_config
from arbor_cli.run import run
from arbor_runtime import ModelSpecError, load_model
from arbor_runtime.loading import inspect_model, smollm2_gguf_path, tiny_random_config

WEIGHTS = Path(__file__).resolve().parents[1] / "arbor_runtime" / "policies" / "weights"


class ModelLoaded(AssertionError):
    """The model was loaded although the config was invalid."""


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test."""

    def refuse(*args, **kwargs):
        raise ModelLoaded("the model was loaded before the config was validated")

    monkeypatch.setattr(arbor_cli.build, "load_model", refuse)


def refused(capsys, data_dir, tmp_path, *overrides: str) -> str:
    """Run with the tiny model and ``overrides``; assert exit 2 and one error line; return the line."""
    base = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={tmp_path / 'run'}", "task.end=901"]
    assert run(compose_config([*base, *overrides])) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("arbor-solve: error: ")
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("controller.n_generate=0", "controller.n_generate=0 must be an integer >= 1"),
        ("controller.breadth=0", "controller.breadth=0 must be an integer >= 1"),
        ("controller.temperature=-1", "controller.temperature=-1 must be a finite number >= 0"),
        ("controller.temperature=nan", "controller.temperature=nan must be a finite number >= 0"),
        ("controller.top_p=2", "controller.top_p=2 must be a number in (0, 1]"),
        ("controller=mcts controller.iterations=0", "controller.iterations=0 must be an integer >= 1"),
        ("controller=beam controller.max_depth=0", "controller.max_depth=0 must be an integer >= 1 or None"),
        ("controller=dfs controller.max_visits=-3", "controller.max_visits=-3 must be an integer >= 1"),
        ("controller=best_first controller.max_expansions=0", "controller.max_expansions=0 must be an integer >= 1"),
        ("seed=abc", "seed='abc' must be an integer"),
        ("policy=arbor policy.host_budget_tokens=-1", "host_budget_tokens=-1 must be an integer >= 0"),
        (
            "policy.budget_ratio=0.5 policy.budget_tokens=100",
            "policy.budget_ratio=0.5 and policy.budget_tokens=100 are both set",
        ),
        ("policy=full policy.budget_tokens=auto", "policy.budget_tokens=auto: FullPolicy keeps every token"),
    ],
)
def test_a_bad_setting_is_one_line_before_the_model_loads(override, said, no_model, data_dir, tmp_path, capsys):
    line = refused(capsys, data_dir, tmp_path, *override.split())
    assert said in line


def test_kvp_weights_missing_or_for_another_model(no_model, data_dir, tmp_path, capsys):
    line = refused(capsys, data_dir, tmp_path, "policy=kvp", f"policy.weights={tmp_path / 'none.safetensors'}")
    assert "none.safetensors" in line and "does not exist" in line and "valid:" in line
    foreign = WEIGHTS / "kvp-smollm2.safetensors"
    line = refused(capsys, data_dir, tmp_path, "policy=kvp", f"policy.weights={foreign}")
    assert "kvp-smollm2.safetensors" in line and "but model.spec=tiny-random has fingerprint" in line
    not_kvp = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(not_kvp))
    line = refused(
        capsys, data_dir, tmp_path, "policy=arbor", "policy.token_scorer=kvp", f"policy.kvp_weights={not_kvp}"
    )
    assert "policy.kvp_weights=" in line and "is not a KVP weights file" in line


def test_kvp_weights_shipped_for_the_tiny_model_pass_validation(no_model, data_dir, tmp_path):
    # validation passes, so the (refused) model load is reached: the error is ours, not a user error
    with pytest.raises(ModelLoaded):
        run(
            compose_config(
                ["model=tiny-random", f"paths.data_dir={data_dir}", "task.end=901", "policy=kvp", f"run_dir={tmp_path}"]
            )
        )


def test_a_budget_no_machine_could_allocate_is_refused(no_model, data_dir, tmp_path, capsys):
    # tiny model: 2 layers x 2 KV heads x 16 x fp32 x (K, V) = 512 bytes a token; 1e11 tokens = 46.6 TiB
    line = refused(capsys, data_dir, tmp_path, "policy=arbor", "policy.budget_tokens=100000000000")
    assert "policy.budget_tokens=100000000000 needs 46.6 TiB of KV (512 bytes a token)" in line
    assert "valid: at most" in line and "auto" in line and "null" in line


@pytest.mark.parametrize("size", [100, 1 << 20])
def test_a_truncated_gguf_is_one_line_naming_the_file(size, no_model, data_dir, tmp_path, capsys):
    cut = tmp_path / f"cut{size}.gguf"
    with smollm2_gguf_path().open("rb") as f:
        cut.write_bytes(f.read(size))
    line = refused(capsys, data_dir, tmp_path, f"model.spec={cut}")
    assert f"GGUF file '{cut}' does not parse" in line


def test_a_gguf_cut_inside_its_tensors_is_truncated(tmp_path):
    whole = smollm2_gguf_path()
    cut = tmp_path / "half.gguf"
    with whole.open("rb") as f:
        cut.write_bytes(f.read(whole.stat().st_size // 2))
    with pytest.raises(ModelSpecError, match=r"half.gguf' is truncated: its tensors end at byte \d+"):
        inspect_model(str(cut), device="cpu")
    assert inspect_model(str(whole), device="cpu").kv_bytes_per_token == 46_080  # SmolLM2 fp32: 30 x 3 x 64 x 2 x 4


def _checkpoint(folder: Path, tied: bool, with_head: bool) -> Path:
    """A tiny Llama checkpoint folder: config.json and model.safetensors (lm_head.weight or not)."""
    from transformers import LlamaForCausalLM

    cfg = tiny_random_config(tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    if not with_head:
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        state.pop("lm_head.weight", None)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_a_checkpoint_without_its_head_is_refused_unless_tied(no_model, data_dir, tmp_path, capsys):
    untied = _checkpoint(tmp_path / "untied", tied=False, with_head=False)
    capsys.readouterr()  # save_pretrained's progress bar
    line = refused(capsys, data_dir, tmp_path, f"model.spec={untied}")
    assert f"checkpoint '{untied}' has no lm_head.weight" in line and "tie_word_embeddings: false" in line
    with pytest.raises(ModelSpecError, match="has no lm_head.weight"):
        load_model(str(untied), device="cpu")  # the API refuses it too
    tied = _checkpoint(tmp_path / "tied", tied=True, with_head=False)
    assert inspect_model(str(tied), device="cpu").kv_bytes_per_token == 512
    whole = _checkpoint(tmp_path / "whole", tied=False, with_head=True)
    assert inspect_model(str(whole), device="cpu").layers == 2


def test_an_empty_data_file_is_named(no_model, tmp_path, capsys):
    (tmp_path / "24.csv").write_text("")
    line = refused(capsys, tmp_path, tmp_path, "task.end=1", "task.start=0")
    expected = "is empty; expected a CSV header with column(s) ['Puzzles'] and rows"
    assert line == f"arbor-solve: error: {tmp_path / '24.csv'} {expected}"
    (tmp_path / "24.csv").write_text("Rank,Puzzles\n")
    line = refused(capsys, tmp_path, tmp_path, "task.end=1", "task.start=0")
    assert "24.csv has a header but no rows" in line


def test_gpus_for_ray_actors_are_checked_against_the_machine(no_model, data_dir, tmp_path, capsys):
    pytest.importorskip("ray")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    line = refused(capsys, data_dir, tmp_path, "runner=ray", f"runner.gpus_per_actor={gpus + 1}")
    assert f"runner.gpus_per_actor={gpus + 1} but this machine has {gpus} GPU(s); valid:" in line


def test_the_console_script_gives_the_same_line(data_dir, tmp_path):
    args = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={tmp_path}", "controller.n_generate=0"]
    proc = subprocess.run(
        [sys.executable, "-c", "from arbor_cli.solve import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "arbor-solve: error: controller.n_generate=0 must be an integer >= 1 (thoughts per frontier node)"
    ]
    assert not (tmp_path / "results.jsonl").exists()
    assert solve.GROUPS  # the script module is the one under test


def test_tiny_model_loads_with_dtype_auto():
    loaded = load_model("tiny-random", device="cpu", dtype="auto")
    assert next(loaded.model.parameters()).dtype == torch.float32  # the tiny model's own dtype
    half = load_model("tiny-random", device="cpu", dtype="bfloat16")
    assert next(half.model.parameters()).dtype == torch.bfloat16
