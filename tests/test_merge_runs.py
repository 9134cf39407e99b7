"""arbor_cli/merge.py and scripts/merge_runs.py: shards of one slice merged into one run dir, on
hand-made run dirs in arbor-solve's formats (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arbor_cli.merge import merge_runs
from arbor_cli.results import load_done, read_jsonl
from arbor_cli.resume import FINGERPRINT_FILE, ConfigMismatch, RunDirLock
from scripts.merge_runs import main


def shard(path: Path, indexes: range, digest: str = "abc", size: int = 100, torn: bool = False) -> Path:
    """A run dir whose results, events and trees hold ``indexes``; ``torn``: the last problem has
    events but no results row (it was killed), as a rerun would find it."""
    (path / "trees").mkdir(parents=True)
    done = list(indexes)[:-1] if torn else list(indexes)
    (path / "results.jsonl").write_text("".join(json.dumps({"index": i, "solved": i % 2 == 0}) + "\n" for i in done))
    (path / "events.jsonl").write_text("".join(json.dumps({"index": i, "events": [i]}) + "\n" for i in indexes))
    for i in indexes:
        (path / "trees" / f"{i}.json").write_text(json.dumps({"nodes": [{"id": 0, "parent": None, "text": str(i)}]}))
    rows = {str(i): f"h{i}" for i in indexes}
    record = {"fingerprint": digest, "settings": {"controller.breadth": digest}, "data": {"size": size, "rows": rows}}
    (path / FINGERPRINT_FILE).write_text(json.dumps(record))
    return path


def test_shards_merge_into_one_run_of_the_whole_slice(tmp_path):
    target, other = shard(tmp_path / "a", range(0, 3)), shard(tmp_path / "b", range(3, 6), torn=True)
    assert merge_runs(target, [other]) == [3, 4]  # 5 has no results row in its shard: left out
    assert sorted(load_done(target)) == [0, 1, 2, 3, 4]
    assert [r["index"] for r in read_jsonl(target / "events.jsonl")] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (target / "trees").iterdir()) == [f"{i}.json" for i in range(5)]
    assert sorted(json.loads((target / FINGERPRINT_FILE).read_text())["data"]["rows"]) == ["0", "1", "2", "3", "4"]
    assert (target / "results.csv").read_text().splitlines()[0].startswith("index,")
    assert merge_runs(target, [other]) == []  # merging twice adds nothing
    assert len(read_jsonl(target / "results.jsonl")) == 5


def test_a_shard_of_another_config_or_data_file_is_refused_before_anything_is_written(tmp_path):
    target = shard(tmp_path / "a", range(0, 2))
    before = (target / "results.jsonl").read_text()
    with pytest.raises(ConfigMismatch, match="another config"):
        merge_runs(target, [shard(tmp_path / "b", range(2, 4), digest="xyz")])
    with pytest.raises(ConfigMismatch, match="another data file"):
        merge_runs(target, [shard(tmp_path / "c", range(2, 4), size=99)])
    assert (target / "results.jsonl").read_text() == before


def test_the_script_says_one_line_and_exits_2_on_a_bad_dir_or_a_busy_target(tmp_path, capsys):
    target = shard(tmp_path / "a", range(0, 2))
    assert main([str(target), str(tmp_path / "missing")]) == 2
    assert "is not a run dir" in capsys.readouterr().err
    other = shard(tmp_path / "b", range(2, 3))
    with RunDirLock(target):  # a run writes there now
        assert main([str(target), str(other)]) == 2
    assert "in use" in capsys.readouterr().err
    assert main([str(target), str(other)]) == 0
    assert "merged 1 problems" in capsys.readouterr().out
