"""Resuming a run dir: torn or corrupt lines are moved aside, every problem is recorded once in every
file, and a rerun with another config refuses (one line) unless resume=force."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from arbor_cli.build import compose_config
from arbor_cli.results import (
    CORRUPT_SUFFIX,
    EVENTS_FILE,
    RESULTS_FILE,
    TRACES_FILE,
    append_jsonl,
    clean_jsonl,
    load_done,
    read_jsonl,
    repair_jsonl,
)
from arbor_cli.resume import ADDED_KEYS, FINGERPRINT_FILE, fingerprint
from arbor_cli.run import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cfg(data_dir, run_dir, *extra):
    base = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={run_dir}", "controller.n_generate=2"]
    return compose_config([*base, "controller.breadth=1", *extra])


def lines(run_dir) -> list[str]:
    return (run_dir / RESULTS_FILE).read_text().splitlines()


def test_torn_last_line_is_set_aside_and_the_problem_recorded_once_in_every_file(data_dir, tmp_path):
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=903"), Console(width=100)) == 0
    path = tmp_path / RESULTS_FILE
    whole = path.read_text()
    assert len(whole.splitlines()) == 3
    torn = whole[whole.rindex("\n", 0, -1) + 1 :][:40]
    path.write_text(whole[: whole.rindex("\n", 0, -1) + 1] + torn)  # an interrupted run: 902's line cut short
    assert not path.read_text().endswith("\n") and len(load_done(tmp_path)) == 2
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=904"), Console(width=100)) == 0
    rows = [json.loads(line) for line in lines(tmp_path)]  # every line is whole JSON
    assert [r["index"] for r in rows] == [900, 901, 902, 903]  # 902 redone once, 903 added, none twice
    for name in (EVENTS_FILE, TRACES_FILE):  # 902's were written before its torn row: dropped, then written anew
        assert [r["index"] for r in read_jsonl(tmp_path / name)] == [900, 901, 902, 903], name
    assert (tmp_path / (RESULTS_FILE + CORRUPT_SUFFIX)).read_text() == torn + "\n"  # moved aside, not lost


def test_corrupt_lines_anywhere_are_moved_aside_and_each_problem_stays_once(data_dir, tmp_path):
    """A garbled line in the middle of results.jsonl and a torn last line of events.jsonl (a run killed
    while writing 902's events: no results row for it) go to *.corrupt; the rerun keeps every other line."""
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=903"), Console(width=100)) == 0
    results = lines(tmp_path)
    (tmp_path / RESULTS_FILE).write_text(results[0] + "\n" + "\x00garbage{\n" + results[1] + "\n")
    events = (tmp_path / EVENTS_FILE).read_text().splitlines()
    (tmp_path / EVENTS_FILE).write_text("\n".join(events[:2]) + "\n" + events[2][:25])
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=903"), Console(width=100)) == 0
    assert lines(tmp_path)[:2] == results[:2]  # done rows kept as they were
    for name in (RESULTS_FILE, EVENTS_FILE, TRACES_FILE):
        assert [r["index"] for r in read_jsonl(tmp_path / name)] == [900, 901, 902], name
    assert (tmp_path / (RESULTS_FILE + CORRUPT_SUFFIX)).read_text() == "\x00garbage{\n"
    assert (tmp_path / (EVENTS_FILE + CORRUPT_SUFFIX)).read_text() == events[2][:25] + "\n"
    assert not (tmp_path / (TRACES_FILE + CORRUPT_SUFFIX)).exists()


def test_repair_keeps_a_whole_last_object_and_cuts_a_torn_one(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"index": 0}\n{"index": 1}')  # whole, only the newline missing
    assert repair_jsonl(path) and path.read_text() == '{"index": 0}\n{"index": 1}\n'
    path.write_text('{"index": 0}\n{"ind')
    assert repair_jsonl(path) and path.read_text() == '{"index": 0}\n'
    path.write_text('{"ind')  # the only line torn
    assert repair_jsonl(path) and path.read_text() == ""
    assert (tmp_path / "r.jsonl.corrupt").read_text() == '{"ind\n{"ind\n'  # torn lines set aside, appended
    assert not repair_jsonl(path) and not repair_jsonl(tmp_path / "missing.jsonl")
    append_jsonl(path, {"index": 2})
    path.write_text(path.read_text() + '{"index": 3')
    append_jsonl(path, {"index": 4})
    assert [r["index"] for r in read_jsonl(path)] == [2, 4]


def test_clean_keeps_one_record_per_index_and_sets_aside_what_is_not_one(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text('{"index": 1, "v": "a"}\n[1, 2]\n\n{"index": 2}\n{"index": 1, "v": "b"}\n{"index": "3"}\n{"ind')
    assert clean_jsonl(path, keep=lambda i: i != 2) == (3, 2)  # 3 set aside; 2 dropped (index 2, index 1's first)
    assert read_jsonl(path) == [{"index": 1, "v": "b"}]  # the last record of an index wins
    assert (tmp_path / "e.jsonl.corrupt").read_text() == '[1, 2]\n{"index": "3"}\n{"ind\n'
    before = path.stat().st_mtime_ns
    assert clean_jsonl(path) == (0, 0) and path.stat().st_mtime_ns == before  # clean: not rewritten
    assert clean_jsonl(tmp_path / "missing.jsonl") == (0, 0)


def test_another_config_refuses_in_one_line_unless_forced(data_dir, tmp_path, capsys):
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=901"), Console(width=100)) == 0
    stored = json.loads((tmp_path / FINGERPRINT_FILE).read_text())
    assert stored["settings"]["controller.n_generate"] == 2 and "paths.data_dir" not in stored["settings"]
    assert run(cfg(data_dir, tmp_path, "task.end=902", "task.start=900", "seed=7")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("arbor-solve: error: run dir") and "\n" not in err
    assert "seed: 0 -> 7" in err and "resume=force" in err
    assert len(lines(tmp_path)) == 1  # nothing was added
    forced = cfg(data_dir, tmp_path, "task.start=900", "task.end=902", "seed=7", "resume=force")
    assert run(forced, Console(width=100)) == 0
    assert [json.loads(line)["index"] for line in lines(tmp_path)] == [900, 901]
    assert json.loads((tmp_path / FINGERPRINT_FILE).read_text())["settings"]["seed"] == 7


def test_a_run_dir_written_before_a_key_was_added_resumes_at_its_old_value(data_dir, tmp_path, capsys):
    """A run dir whose stored settings predate ``verifier.lookahead`` (:data:`ADDED_KEYS`) resumes when the
    rerun leaves it at 0 (what the old runtime did), and refuses in one line when the rerun asks for trials."""
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=901"), Console(width=100)) == 0
    path = tmp_path / FINGERPRINT_FILE
    record = json.loads(path.read_text())
    assert record["settings"].pop("verifier.lookahead") == ADDED_KEYS["verifier.lookahead"] == 0
    record["fingerprint"] = "written-before"  # as an older version stored it: another digest, no such key
    path.write_text(json.dumps(record))
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=902"), Console(width=100)) == 0
    assert [json.loads(line)["index"] for line in lines(tmp_path)] == [900, 901]
    assert json.loads(path.read_text())["settings"]["verifier.lookahead"] == 0  # stored as now
    record = json.loads(path.read_text())
    del record["settings"]["verifier.lookahead"]
    path.write_text(json.dumps(record | {"fingerprint": "written-before"}))
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=903", "verifier.lookahead=1")) == 2
    assert "verifier.lookahead: 0 -> 1" in capsys.readouterr().err  # the old value it was read as
    assert len(lines(tmp_path)) == 2  # nothing was added


def test_a_run_dir_from_before_model_weights_resumes_where_auto_picks_what_it_ran(data_dir, tmp_path):
    """A record without ``model.weights`` (float32, ``dense``) and with a key fingerprints no longer hold
    (``policy.reference_may_differ``): the tiny model's rerun at ``weights=auto`` (dense there) resumes it."""
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=901"), Console(width=100)) == 0
    path = tmp_path / FINGERPRINT_FILE
    record = json.loads(path.read_text())
    assert record["settings"]["model.weights"] == "dense"  # auto, recorded as what it picked
    del record["settings"]["model.weights"]
    record["settings"]["policy.reference_may_differ"] = []
    path.write_text(json.dumps(record | {"fingerprint": "written-before"}))
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=902"), Console(width=100)) == 0
    assert [json.loads(line)["index"] for line in lines(tmp_path)] == [900, 901]


def test_a_float32_run_dir_is_refused_where_auto_now_picks_int4(tmp_path):
    """The default model's old run dirs ran float32: at ``weights=auto`` (int4 on a CPU) the rerun is
    refused naming the change, before any model loads; ``model.weights=dense`` resumes them."""
    from arbor_cli.resume import ConfigMismatch, check_resume

    new = compose_config(["model=smollm2", "model.device=cpu", f"run_dir={tmp_path}"])
    _, settings = fingerprint(new)
    assert settings["model.weights"] == "int4"
    old = {k: v for k, v in settings.items() if k != "model.weights"}
    (tmp_path / FINGERPRINT_FILE).write_text(json.dumps({"fingerprint": "written-before", "settings": old}))
    (tmp_path / RESULTS_FILE).write_text('{"index": 900}\n')
    with pytest.raises(ConfigMismatch, match='model.weights: "dense" -> "int4"'):
        check_resume(tmp_path, new)
    check_resume(tmp_path, compose_config(["model=smollm2", "model.device=cpu", "model.weights=dense"]))


def test_resume_false_refuses_a_dir_with_results(data_dir, tmp_path, capsys):
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=901"), Console(width=100)) == 0
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=901", "resume=false")) == 2
    assert "already holds results and resume=false" in capsys.readouterr().err


def test_fingerprint_ignores_paths_slices_and_output_switches(tmp_path):
    base = fingerprint(compose_config(["task=gsm8k"]))[0]
    same = ["paths.data_dir=/x", "paths.output_dir=/y", "task.start=3", "task.end=9", "show_tree=true"]
    assert fingerprint(compose_config(["task=gsm8k", *same, "save_trees=false", f"run_dir={tmp_path}"]))[0] == base
    for other in ("task.max_steps=3", "policy=arbor", "controller=dfs", "model=tiny-random", "verifier=llm_value"):
        assert fingerprint(compose_config(["task=gsm8k", other]))[0] != base, other


def test_an_arbor_run_dir_from_before_its_switches_resumes_with_every_part_on(data_dir, tmp_path, capsys):
    """Arbor's part switches (issue 65) were added to conf/policy/arbor.yaml after run dirs were made: a dir
    without them resumes when they stay on, and a rerun that switches one off is refused naming it."""
    arbor = ("policy=arbor", "policy.budget_tokens=4000")
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=901", *arbor), Console(width=100)) == 0
    path = tmp_path / FINGERPRINT_FILE
    record = json.loads(path.read_text())
    for key in ("policy.msve", "policy.topology", "policy.extract", "policy.host_tier", "policy.pins"):
        assert record["settings"].pop(key) == ADDED_KEYS[key]
    path.write_text(json.dumps(record | {"fingerprint": "written-before"}))
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=902", *arbor), Console(width=100)) == 0
    assert [json.loads(line)["index"] for line in lines(tmp_path)] == [900, 901]
    record = json.loads(path.read_text())
    del record["settings"]["policy.host_tier"]
    path.write_text(json.dumps(record | {"fingerprint": "written-before"}))
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=903", *arbor, "policy.host_tier=false")) == 2
    assert "policy.host_tier: true -> false" in capsys.readouterr().err
