"""Every boolean switch parses one way, and none runs a model folder's code unasked (issue 63).

On main before this, ``view=off``, ``save_trees=no``, ``show_tree=off`` and ``view=maybe`` were accepted
as strings, which Python reads as true: the viewer was written, the trees kept, the tree printed. And
``model.trust_remote_code=off`` (or ``no``, ``maybe``; in Python ``trust_remote_code='false'``) ran the
model folder's own code: transformers takes any non-empty string as yes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import arbor_cli.build
from arbor_cli.build import compose_config
from arbor_cli.run import run
from arbor_cli.switches import FALSE_WORDS, TRUE_WORDS, normalize_switches, parse_switch, switch_keys
from arbor_runtime import load_model

SPELLED_FALSE = [*FALSE_WORDS, "OFF", "No", "False", "FALSE", 0]
SPELLED_TRUE = [*TRUE_WORDS, "ON", "Yes", "True", 1]


def base(data_dir: Path, run_dir: Path) -> list[str]:
    return ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={run_dir}", "task.end=901"]


@pytest.mark.parametrize("word", SPELLED_FALSE)
def test_every_spelling_of_false_is_false(word):
    assert parse_switch(word, "view") is False


@pytest.mark.parametrize("word", SPELLED_TRUE)
def test_every_spelling_of_true_is_true(word):
    assert parse_switch(word, "view") is True


@pytest.mark.parametrize("word", ["maybe", "", "2", 2, -1, 0.5, "nope", "offf", None, [True]])
def test_anything_else_is_refused_naming_the_key_and_the_spellings(word):
    with pytest.raises(ValueError, match=r"^view=.* is not a switch; valid: true/false, 1/0, yes/no or on/off"):
        parse_switch(word, "view")


def test_the_switches_are_read_from_the_shipped_configs():
    """Every key some shipped yaml gives a boolean is a switch (a new one is covered without a code change)."""
    keys = set(switch_keys())
    assert {"view", "save_trees", "show_tree", "share_prefixes", "model.trust_remote_code"} <= keys
    assert {"controller.release_pruned", "controller.rollout", "policy.degrade", "task.answer_grammar"} <= keys
    assert "resume" not in keys  # true / false / force: parsed on its own


@pytest.mark.parametrize(("word", "mode"), [("force", "force"), ("FORCE", "force"), ("no", False), ("on", True)])
def test_resume_takes_the_switch_words_or_force(word, mode):
    cfg = compose_config([f"resume={word}"])
    assert normalize_switches(cfg).resume == mode


def test_normalize_turns_every_switch_into_a_bool():
    cfg = normalize_switches(
        compose_config(["view=off", "save_trees=no", "show_tree=OFF", "share_prefixes=1", "model.trust_remote_code=no"])
    )
    assert (cfg.view, cfg.save_trees, cfg.show_tree, cfg.share_prefixes) == (False, False, False, True)
    assert cfg.model.trust_remote_code is False


def test_view_off_save_trees_no_show_tree_off_do_what_they_say(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [*base(data_dir, run_dir), "view=off", "save_trees=no", "show_tree=off"]
    assert run(compose_config(argv), Console(width=120)) == 0
    out = capsys.readouterr().out
    assert not (run_dir / "view").exists(), "view=off wrote the viewer"
    assert not (run_dir / "trees").exists(), "save_trees=no kept the trees"
    assert "view:" not in out and "KV at the end" not in out, "show_tree=off printed the tree"
    assert json.loads((run_dir / "results.jsonl").read_text())["index"] == 900


@pytest.mark.parametrize("override", ["view=maybe", "save_trees=2", "show_tree=nah", "model.trust_remote_code=maybe"])
def test_a_switch_that_spells_neither_is_one_line_before_the_model_loads(override, data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(arbor_cli.build, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    proc = subprocess.run(
        [sys.executable, "-m", "arbor_cli.solve", *base(data_dir, tmp_path / "run"), override],
        capture_output=True,
        text=True,
        timeout=120,
    )
    key = override.split("=")[0]
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"arbor-solve: error: {key}=")
    assert line.endswith("is not a switch; valid: true/false, 1/0, yes/no or on/off (any case)")
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run dir


# ---- trust_remote_code -------------------------------------------------------------------------
#: a model folder whose config names its own code (``auto_map``): importing ``custom.py`` writes a marker
CUSTOM = """
import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")  # transformers imports a copy from its own cache
from transformers import LlamaConfig, LlamaForCausalLM


class CustomConfig(LlamaConfig):
    model_type = "llama"


class CustomModel(LlamaForCausalLM):
    config_class = CustomConfig
"""


@pytest.fixture
def remote_code_folder(tiny, tmp_path) -> Path:
    """A complete tiny Llama checkpoint (weights, tokenizer) whose config.json also names ``custom.py``."""
    folder = tmp_path / "model"
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "custom.py").write_text(CUSTOM.format(marker=str(folder / "MARKER")))
    return folder


@pytest.mark.parametrize("word", ["false", "off", "no", "0", "OFF", "False"])
def test_no_spelling_of_false_runs_the_folders_code_from_the_command_line(word, remote_code_folder, data_dir, tmp_path):
    argv = [f"model.spec={remote_code_folder}", f"model.trust_remote_code={word}", "task.end=901"]
    argv += [f"paths.data_dir={data_dir}", f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "-m", "arbor_cli.solve", *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (remote_code_folder / "MARKER").exists(), f"model.trust_remote_code={word} ran the folder's code"


@pytest.mark.parametrize("value", ["false", "False", "off", "no", "", 0, None])
def test_the_api_takes_only_a_bool(value, remote_code_folder):
    with pytest.raises(ValueError, match=r"trust_remote_code=.* must be True or False"):
        load_model(str(remote_code_folder), device="cpu", trust_remote_code=value)
    assert not (remote_code_folder / "MARKER").exists()


def test_trust_remote_code_true_is_what_runs_it(remote_code_folder):
    """The marker is a real detector: asked for, the folder's code runs."""
    load_model(str(remote_code_folder), device="cpu", trust_remote_code=True)
    assert (remote_code_folder / "MARKER").exists()
