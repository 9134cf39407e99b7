"""Task data loading: local files, hub datasets through ``datasets`` (a local folder here: no hub is
reachable from the test machines), and one-line errors when neither works."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from synthetic_data import GSM8K_TEST, GSM8K_TRAIN

from arbor_cli.build import build_task, compose_config
from arbor_runtime.tasks.data import DataSource, DataUnavailable, HubPart, find_file, load_rows, read_rows

GSM8K = DataSource.from_config(compose_config(["task=gsm8k"]).task.source)


def test_sources_come_from_the_task_configs():
    assert GSM8K.folder == "gsm8k" and GSM8K.splits == ["test", "train"]
    assert GSM8K.hub["test"] == (HubPart("openai/gsm8k", "test", "main"),)
    aime = DataSource.from_config(compose_config(["task=aime"]).task.source)
    assert [p.path for p in aime.hub["test"]] == ["Maxwell-Jia/AIME_2024", "math-ai/aime25"]
    assert aime.hub["test"][0].fields == {"id": "ID", "problem": "Problem", "answer": "Answer"}


def test_local_files_by_split(data_dir):
    rows, origin = load_rows(GSM8K, "train", data_dir, ("question", "answer"))
    assert rows == list(GSM8K_TRAIN) and origin == str(data_dir / "gsm8k" / "train.jsonl")
    assert find_file(data_dir / "gsm8k", "gsm8k", "test.jsonl") == data_dir / "gsm8k" / "test.jsonl"
    assert read_rows(data_dir / "game24" / "24.csv", ("Puzzles",))[0]["Rank"] == "1"
    with pytest.raises(ValueError, match="no column\\(s\\) \\['Nope'\\]"):
        read_rows(data_dir / "game24" / "24.csv", ("Nope",))
    with pytest.raises(ValueError, match="split 'dev' is not one of \\['test', 'train'\\]"):
        load_rows(GSM8K, "dev", data_dir, ())


def test_the_hub_path_reads_a_dataset_through_datasets(data_dir, tmp_path):
    """The same loader with a dataset that ``datasets`` reads from a local folder, renaming columns."""
    source = DataSource("gsm8k", {"test": "test.jsonl"}, {"test": [HubPart(str(data_dir / "gsm8k"), "test")]})
    rows, origin = load_rows(source, "test", None, ("question", "answer"), cache_dir=str(tmp_path))
    assert rows == list(GSM8K_TEST) and origin == f"{data_dir / 'gsm8k'}:test"
    renamed = HubPart(str(data_dir / "gsm8k"), "train", fields={"q": "question"})
    source = DataSource("gsm8k", {}, {"train": [renamed, renamed]})
    rows, _ = load_rows(source, "train", None, ("q",), cache_dir=str(tmp_path))
    assert len(rows) == 2 * len(GSM8K_TRAIN) and rows[0]["q"] == GSM8K_TRAIN[0]["question"]


def test_a_task_without_data_dir_loads_from_the_hub(data_dir, tmp_path):
    hub = f"task.source.hub.test=[{{path: {data_dir / 'math500'}, split: test}}]"
    cfg = compose_config(["task=math500", hub, f"+task.cache_dir={tmp_path}", "task.end=2"])
    task = build_task(cfg)
    assert [p.answer for p in task.problems()] == ["\\frac{5}{6}", "3\\sqrt{5}"]
    assert task.data_origin == f"{data_dir / 'math500'}:test"


def test_without_datasets_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataUnavailable, match=r"arbor-runtime\[hub\].*paths.data_dir") as err:
        load_rows(GSM8K, "test", None, ())
    assert "\n" not in str(err.value)


def test_offline_hub_is_one_line_through_arbor_solve(tmp_path):
    """No data folder and no hub: arbor-solve ends with one line naming the dataset and paths.data_dir."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    cmd = [sys.executable, "-m", "arbor_cli.solve", "task=gsm8k", "model=tiny-random", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("arbor-solve:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "could not load openai/gsm8k (split test) through datasets" in lines[0]
    assert "Set paths.data_dir" in lines[0]
