"""CLI: composition of every config group, an end-to-end run on the tiny model, resume, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from hydra.utils import instantiate
from rich.console import Console
from synthetic_data import SIZES, game24_puzzles

from arbor_cli import solve
from arbor_cli.budget import PolicyFactory
from arbor_cli.build import build_task, build_verifier, compose_config
from arbor_cli.run import run
from arbor_runtime import Runtime
from arbor_runtime.controllers.base import Controller

CONF = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> list[str]:
    return sorted(str(p.relative_to(CONF / group).with_suffix("")) for p in (CONF / group).rglob("*.yaml"))


def compose_cfg(*overrides: str):
    return compose_config(overrides)


def tiny_overrides(data_dir, run_dir, *extra):
    return ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={run_dir}", *extra]


def puzzle(index: int) -> str:
    return " ".join(map(str, game24_puzzles()[index]))


def fit_synthetic_rows(cfg, overrides: list[str]):
    """``cfg`` with its task slice cut to the synthetic data's rows where an experiment asks for more
    (conf/experiment/table1_gsm8k.yaml: GSM8K rows 0-19; the synthetic file has 4)."""
    size = SIZES.get(cfg.task.get("name"))
    end = cfg.task.get("end")
    if size is None or end is None or end <= size:
        return cfg
    start = min(cfg.task.get("start") or 0, size - 1)
    return compose_cfg(*overrides, f"task.start={start}", f"task.end={size}")


@pytest.mark.parametrize("group", ["task", "policy", "controller", "model", "verifier", "experiment", "paths"])
def test_every_config_group_composes_and_instantiates(group, tiny, data_dir):
    for option in options(group):
        fitting_task = ["task=gsm8k"] if (group, option) == ("verifier", "answer_match") else []
        overrides = [*fitting_task, f"{group}={option}", f"paths.data_dir={data_dir}"]
        cfg = fit_synthetic_rows(compose_cfg(*overrides), overrides)
        task = build_task(cfg)
        assert task.problems()
        policy = PolicyFactory(cfg.policy, task.problems()[:1]).build(None)
        verifier = build_verifier(cfg, task)
        controller = instantiate(cfg.controller, runtime=Runtime(tiny, policy=policy), task=task, verifier=verifier)
        assert isinstance(controller, Controller) and verifier.name in task.verifiers
        assert cfg.model.spec


@pytest.mark.parametrize(("task", "verifier"), [("game24", "llm_value"), ("gsm8k", "answer_match")])
def test_each_task_config_selects_its_own_verifier(task, verifier, data_dir):
    cfg = compose_cfg(f"task={task}", f"paths.data_dir={data_dir}")
    assert build_verifier(cfg, build_task(cfg)).name == verifier
    cfg = compose_cfg(f"task={task}", "verifier=llm_value", f"paths.data_dir={data_dir}")
    assert build_verifier(cfg, build_task(cfg)).name == "llm_value"


def test_a_verifier_that_does_not_fit_the_task_is_a_clear_error(data_dir, tmp_path, capsys):
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task=gsm8k", "verifier=game24_oracle", "task.end=1"))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip()
    assert err == "arbor-solve: error: verifier=game24_oracle does not fit task=gsm8k; valid: answer_match, llm_value"


def test_cli_runs_one_puzzle_and_resumes(data_dir, tmp_path):
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task.start=900", "task.end=901", "task.propose=sample"))
    console = Console(record=True, width=200)
    assert run(cfg, console=console) == 0
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [900]
    assert rows[0]["question"] == puzzle(900) and rows[0]["prefill_tokens"] > 0
    # the search's counts: bfs makes one generation call per expanded node; game24 calls no model
    assert rows[0]["model_calls"] == rows[0]["generation_calls"] == rows[0]["nodes_expanded"] >= 1
    assert rows[0]["verifier_calls"] == 0
    assert rows[0]["duplicates_dropped"] == repeated_states(tmp_path / "trees" / "900.json")
    assert "game24" in console.export_text()
    assert (tmp_path / "results.csv").is_file() and (tmp_path / "traces.jsonl").is_file()
    # widen the slice and rerun in the same dir: 900 is skipped (not appended twice), 901 is added
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task.start=900", "task.end=902", "task.propose=sample"))
    assert run(cfg, console=Console(width=200)) == 0
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [900, 901]


def repeated_states(tree_json: Path) -> int:
    """Thoughts of an exported Game of 24 tree whose numbers left ("(left: ...)" in the step's text)
    were already reached, in creation order (what the controller drops as duplicates); counted from
    the tree's text alone. Checks that the tree flags exactly those nodes as duplicates. The forced
    "Answer: ..." line under a terminal step is no thought of its own."""
    tree = json.loads(tree_json.read_text())
    nodes = sorted(tree["nodes"], key=lambda n: n["id"])
    seen, repeats = {tuple(sorted(Fraction(x) for x in tree["question"].split()))}, []
    for node in nodes:
        left = re.search(r"\(left: ([^)]*)\)", node["text"])
        if node["parent"] is None or not node["meta"].get("valid") or left is None:
            continue
        key = tuple(sorted(Fraction(x) for x in left.group(1).split()))
        if key in seen:
            repeats.append(node["id"])
        seen.add(key)
    assert repeats == [n["id"] for n in nodes if n["meta"].get("duplicate")]
    return len(repeats)


def test_duplicate_states_are_dropped_and_counted(data_dir, tmp_path):
    """Legal steps reach one multiset of numbers along several paths (from 4 4 4 5, "-3 4" follows
    both 4 + 4 then 5 - 8 and 5 - 4 then 1 - 4): the row counts each repeat the tree shows."""
    over = ["task.start=900", "task.end=901", "task.propose=legal", "task.n_shots=1"]
    over += ["controller.n_generate=3", "controller.breadth=2"]
    assert run(compose_cfg(*tiny_overrides(data_dir, tmp_path, *over)), console=Console(width=200)) == 0
    (row,) = read_rows(tmp_path)
    assert row["duplicates_dropped"] == repeated_states(tmp_path / "trees" / "900.json") > 0


def test_budget_overrun_is_recorded_as_oom(data_dir, tmp_path):
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task.end=901", "policy.budget_tokens=620"))
    assert run(cfg, console=Console(width=200)) == 0
    row = json.loads((tmp_path / "results.jsonl").read_text())
    assert row["oom"] is True and "budget_tokens=620" in row["error"]
    assert row["nodes_expanded"] >= 1 and row["model_calls"] >= 1  # counted up to the OOM
    assert row["peak_device_tokens"] <= 620


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("task.start=950", "task.start=950 is greater than task.end=901"),
        ("model.spec=/no/such/model.gguf", "does not exist"),
        ("policy.budget_tokens=-5", "budget_tokens=-5"),
        ("task.start=abc", "game24: task.start='abc' must be an integer row index >= 0"),  # was: '<' not supported
        ("controller.temperature='héllo'", "controller.temperature='héllo' must be a finite number >= 0"),
    ],
)
def test_bad_values_end_with_one_clear_line(override, message, data_dir, tmp_path, capsys):
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task.end=901", override))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("arbor-solve: error:") and message in err and "\n" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["policy=lru"], "policy='lru' is not an option of policy; valid: arbor, full, h2o, kvp, lychee, oracle_topk,"),
        (["-m", "task=gsm8k,aime2"], "task='aime2' is not an option of task; valid: aime, game24, gsm8k, math500"),
        (["experiment=acc/nope"], "experiment='acc/nope' is not an option of experiment; valid: acc/cot, acc/io,"),
        (["+controller=bfz"], "controller='bfz' is not an option of controller; valid: beam, best_first, bfs, dfs,"),
    ],
)
def test_an_unknown_config_group_option_is_one_line_naming_the_valid_ones(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["arbor-solve", *argv])
    with pytest.raises(SystemExit) as stop:
        solve.main()
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith(f"arbor-solve: error: {message}") and "\n" not in err
    assert solve.check_choices(["policy=full,arbor", "task=choice(gsm8k,x)", "task.end=3", "experiment=acc/io"]) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["budget=-3"], "budget=-3: the config has no key 'budget'; valid: concurrency, controller, model, paths,"),
        (
            ["policy=h2o", "policy.heavy_ratioo=0.2"],
            "policy.heavy_ratioo=0.2: policy has no key 'heavy_ratioo'; valid: _target_, budget_ratio,",
        ),
        (["-m", "task=gsm8k,math500", "task.n_shot=2"], "task.n_shot=2: task has no key 'n_shot'; valid: _convert_,"),
        (["seed.x=3"], "seed.x=3: seed is a value (0), not a group of keys"),
        (["hydra.run.dirr=out"], "hydra.run.dirr=out: hydra.run has no key 'dirr'; valid: dir (+hydra.run.dirr=out"),
        (["task.end=[1,2"], "task.end=[1,2: no viable alternative at input '[1,2'"),
        (["+seed=3"], "Could not append to config. An item is already at 'seed'."),
        # issue 47: these were tracebacks (exit 1) or the raw lexer exception
        (["=5"], "=5: an override needs a key before '='; valid: key=value"),
        (["seed=" + "9" * 5000], "seed=" + "9" * 75 + "... (5,005 characters): Exceeds the limit (4300 digits)"),
        (
            ["controller.temperature=héllo"],
            "controller.temperature=héllo: Hydra reads only ASCII characters in an unquoted value; valid: quote it, "
            "controller.temperature='héllo'",
        ),
    ],
)
def test_an_override_hydra_cannot_apply_is_one_line_before_anything_runs(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["arbor-solve", *argv])
    monkeypatch.setattr(solve, "_solve", lambda: pytest.fail("Hydra's app ran"))
    with pytest.raises(SystemExit) as stop:
        solve.main()
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith(f"arbor-solve: error: {message}") and "\n" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "policy=full,arbor", "task.start=range(0,3)", "task.end=5"],
        ["policy=h2o", "policy.heavy_ratio=0.2", "+extra=1", "hydra.run.dir=/tmp/x", "hydra.job.chdir=false"],
        ["experiment=demo", "task.propose=legal", "~seed"],
        ["task.start=interval(0,3)"],  # no first value: Hydra's sweeper judges it
        ["--cfg", "job", "nokey=1"],  # a flag that changes what is composed: Hydra judges the command
    ],
)
def test_overrides_hydra_applies_pass_the_check(argv):
    assert solve.check_overrides(argv) is None


def test_console_script_refuses_a_misspelt_key_with_exit_2(tmp_path):
    cmd = [sys.executable, "-m", "arbor_cli.solve", "polcy.budget_tokens=500", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("arbor-solve: error: polcy.budget_tokens=500: the config has no key 'polcy'")
    assert "\n" not in proc.stderr.strip() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_run_dir_that_is_a_file_is_one_line_before_anything_runs(below, tmp_path, monkeypatch, capsys):
    """Was: Hydra's FileExistsError traceback, exit 1."""
    (tmp_path / "afile").write_text("x")
    run_dir = tmp_path / "afile" / below if below else tmp_path / "afile"
    monkeypatch.setattr(sys, "argv", ["arbor-solve", "model=tiny-random", f"run_dir={run_dir}"])
    monkeypatch.setattr(solve, "_solve", lambda: pytest.fail("Hydra's app ran"))
    with pytest.raises(SystemExit) as stop:
        solve.main()
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err
    assert err.startswith(f"arbor-solve: error: run_dir={run_dir}: ") and "a file, not a folder" in err


def test_a_model_config_without_its_geometry_names_the_missing_key(data_dir, tmp_path, capsys):
    """Was: "arbor-solve: error: 'num_attention_heads'" (a bare KeyError)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path / "run", "task.end=901", f"model.spec={model}"))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"arbor-solve: error: model.spec={model}: its config has no 'num_attention_heads'")
    assert "\n" not in err


def test_a_binary_data_file_is_named(tmp_path, capsys):
    """Was: "'utf-8' codec can't decode byte 0xa0 in position 0" with no file named."""
    data = tmp_path / "data" / "game24"
    data.mkdir(parents=True)
    (data / "24.csv").write_bytes(bytes(range(128, 256)) * 8)
    cfg = compose_cfg(*tiny_overrides(tmp_path / "data", tmp_path / "run"))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"arbor-solve: error: {data / '24.csv'}: not UTF-8 text (byte 0); valid: a UTF-8 .csv data file"


def test_missing_data_dir(tmp_path, capsys):
    cfg = compose_cfg(*tiny_overrides(tmp_path / "nowhere", tmp_path))
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip()
    assert str(tmp_path / "nowhere") in err and "paths.data_dir" in err and "\n" not in err


def test_console_script_end_to_end(data_dir, tmp_path):
    """The installed `arbor-solve` entry point, as a user runs it (Hydra app, run dir from Hydra)."""
    cmd = [
        sys.executable, "-m", "arbor_cli.solve", "model=tiny-random", f"paths.data_dir={data_dir}",
        "task.start=901", "task.end=902", f"hydra.run.dir={tmp_path}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "results.jsonl").read_text())["index"] == 901
    assert (tmp_path / ".hydra" / "overrides.yaml").is_file()  # Hydra's record, written once the run was accepted
    # a run dir of its own given as run_dir=, from another working directory, refused: nothing is left of it
    bad_cmd = [*cmd[:-3], "task.start=5", "task.end=2", f"run_dir={tmp_path / 'bad'}"]
    (tmp_path / "cwd").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(solve.__file__).parents[1]), *sys.path])}
    bad = subprocess.run(bad_cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path / "cwd", env=env)
    assert bad.returncode == 2 and "task.start=5 is greater than task.end=2" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert list((tmp_path / "cwd").iterdir()) == [] and not (tmp_path / "bad").exists()


def read_rows(run_dir):
    return [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]


def test_arbor_policy_run_writes_events(data_dir, tmp_path):
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task.start=901", "task.end=902", "policy=arbor"))
    assert run(cfg, console=Console(width=200)) == 0
    row = read_rows(tmp_path)[0]
    assert row["policy"] == "arbor" and not row["oom"]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0]["index"] == 901 and {e["kind"] for e in events[0]["events"]} >= {"node_end"}


@pytest.mark.parametrize("policy", ["h2o", "arbor"])
def test_a_per_head_run_under_a_budget_records_its_granularity(policy, data_dir, tmp_path):
    overrides = ("task.start=901", "task.end=902", f"policy={policy}", "policy.granularity=head")
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, *overrides, "policy.budget_tokens=700"))
    assert run(cfg, console=Console(width=200)) == 0
    row = read_rows(tmp_path)[0]
    assert row["granularity"] == "head" and row["policy"] == policy and row["peak_device_tokens"] <= 700
    assert row["evicted_tokens"] > 0 and row["error"] is None


def test_budget_ratio_reads_the_reference_run(data_dir, tmp_path):
    common = ["task.start=901", "task.end=902", "controller.n_generate=2", "controller.breadth=2"]
    ref = tmp_path / "full"
    assert run(compose_cfg(*tiny_overrides(data_dir, ref, *common)), console=Console(width=200)) == 0
    peak = read_rows(ref)[0]["peak_device_tokens"]
    out = tmp_path / "ratio"
    over = ["policy=arbor", "policy.budget_ratio=1.2", f"policy.budget_reference={ref}"]
    assert run(compose_cfg(*tiny_overrides(data_dir, out, *common, *over)), console=Console(width=200)) == 0
    assert read_rows(out)[0]["budget_tokens"] == int(1.2 * peak)


def test_budget_below_active_path_fails_up_front(data_dir, tmp_path, capsys):
    over = ("task.end=901", "policy=arbor", "policy.budget_tokens=520", "policy.degrade=false")
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, *over))
    assert run(cfg) == 2
    err = capsys.readouterr().err
    assert "policy.budget_tokens=520 is smaller than the active path of problem 900 needs" in err
    assert not (tmp_path / "results.jsonl").exists()
    # below one prompt token and one thought no policy could run, degrading arbor included
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task.end=901", "policy=arbor", "policy.budget_tokens=20"))
    assert run(cfg) == 2
    assert "one prompt token (it is prefilled in chunks) + one thought" in capsys.readouterr().err
    assert not (tmp_path / "results.jsonl").exists()
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, "task.end=901", "policy.budget_ratio=0.5"))
    assert run(cfg) == 2
    assert "needs policy.budget_reference" in capsys.readouterr().err


def test_ratio_budgets_too_small_for_a_problem_are_recorded_as_oom(data_dir, tmp_path):
    common = ["task.start=901", "task.end=902", "controller.n_generate=2", "controller.breadth=2"]
    ref = tmp_path / "full"
    assert run(compose_cfg(*tiny_overrides(data_dir, ref, *common)), console=Console(width=200)) == 0
    out = tmp_path / "ratio"
    over = ["policy=arbor", "policy.budget_ratio=0.5", f"policy.budget_reference={ref}", "policy.degrade=false"]
    assert run(compose_cfg(*tiny_overrides(data_dir, out, *common, *over)), console=Console(width=200)) == 0
    row = read_rows(out)[0]
    assert row["oom"] is True and "smaller than the active path of problem 901 needs" in row["error"]


def test_arbor_below_its_floor_runs_lossy_and_says_so_first(data_dir, tmp_path):
    """The budget a user's device has, set from the start, below arbor's floor (the prompt alone is
    larger): the run's first line says arbor will be lossy and why; every problem runs, never over
    the budget, nothing dropped from the host tier."""
    console = Console(width=400, record=True)
    over = ["policy=arbor", "policy.budget_tokens=300", "task.start=900", "task.end=902"]
    over += ["controller.n_generate=2", "controller.breadth=2"]
    assert run(compose_cfg(*tiny_overrides(data_dir, tmp_path, *over)), console=console) == 0
    first = console.export_text().splitlines()[0]
    assert first.startswith("policy.budget_tokens=300 is below arbor's exact floor on 2 of 2 problems")
    assert "token-extracts the few-shot examples" in first
    rows = read_rows(tmp_path)
    assert [r["oom"] for r in rows] == [False, False]
    assert all(r["peak_device_tokens"] <= 300 and r["evicted_tokens"] > 0 for r in rows)
    assert all(r["nodes_expanded"] >= 1 for r in rows)


def test_sparse_policy_over_arbor_runs_and_reports_its_index(data_dir, tmp_path):
    over = ["policy=lychee", "policy.memory=arbor", "policy.budget_tokens=900", "policy.min_block_tokens=8"]
    over += ["policy.token_budget=24", "policy.dense_below=0", "task.start=901", "task.end=902"]
    over += ["task.propose=sample"]  # dense_below=0: sparse at the tiny model's short contexts too
    cfg = compose_cfg(*tiny_overrides(data_dir, tmp_path, *over))
    assert run(cfg, console=Console(width=200)) == 0
    row = read_rows(tmp_path)[0]
    assert row["policy"] == "lychee" and not row["oom"]
    assert row["peak_index_bytes"] > 0 and 0 < row["index_kv_ratio"] < 0.05 and row["sparse_read_fraction"] < 1
    assert row["peak_device_tokens"] <= 900 - 45  # the pool is the budget less lychee's 5% index reserve
