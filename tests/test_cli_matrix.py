"""The CLI matrix: every policy x every controller x (local, ray) runner x concurrency 1 / 2, run as
`arbor-solve` runs (:func:`arbor_cli.solve.main`, its Hydra app, in this process), and every bad
value of issue 21 refused in one line before the model loads.

Each cell is the shipped defaults of every config group (task=game24 with its llm_value verifier,
the controller's and policy's own settings, runner=local / ray as shipped) on ``model=tiny-random``
and two Game of 24 problems (rows 900-901 of the synthetic data; two keep CI near 25 min). Only the
budget is set, from the start, for the policies that take one (:data:`BUDGETS`; full gets none). A cell passes when the
run exits 0 with no traceback in its output, each problem is recorded exactly once in
results.jsonl, events.jsonl and traces.jsonl, no row is an OOM or an error, and each row's peak
device bytes (KV, plus a sparse policy's index) stay within its budget.

Ray cells share one local Ray instance (:func:`local_ray`: 2 CPUs, no GPUs, no dashboard), started
once for the module. Every actor imports torch and loads its own model, so a ray cell took 20-50 s
on a busy 2-core machine and the full ray product (90 cells) would take far more than the ~3
minutes this file allows for ray; the ray cells are a subset: policy ``i`` of :data:`POLICIES`
(sorted) runs with controller ``i mod 5`` of :data:`CONTROLLERS` (sorted) at concurrency
``1 + i mod 2``. That covers every policy and every controller on ray at least once, and both
concurrencies (:data:`RAY_CELLS`). Local cells run the full product. The in-process model loader
is memoized per model spec (the same tiny model object for every local cell, as one run shares it
between its problems).
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from synthetic_data import write_data_dir

import arbor_cli.build
import arbor_runtime
import arbor_runtime.loading
from arbor_cli import solve
from arbor_cli.results import EVENTS_FILE, RESULTS_FILE, TRACES_FILE
from arbor_runtime.kv.store import KVShape
from arbor_runtime.loading import smollm2_gguf_path

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONF = Path(__file__).resolve().parents[1] / "conf"
POLICIES = sorted(p.stem for p in (CONF / "policy").glob("*.yaml"))
CONTROLLERS = sorted(p.stem for p in (CONF / "controller").glob("*.yaml"))
PROBLEMS = (900, 901)
#: budget_tokens set from the start. The prompt is 504 tokens; arbor keeps the active path whole and
#: its deepest path (game24's max_steps, legal or sampled steps) fits in 640, below the 648 tokens
#: the sampled-step searches peak at under full (817-1176 with legal steps): the policies that evict
#: or drop (arbor, h2o, kvp, snapkv, streaming, thinkv) must manage. lychee, quest and oracle_topk decide only
#: what decode reads; their memory policy is full (it never frees a token), so their budget holds
#: whole trees (two at once at concurrency 2: up to ~2,400 tokens) plus the 3% index reserve.
SPARSE_BUDGETS = dict.fromkeys(("lychee", "quest", "oracle_topk"), 4096)
BUDGETS: dict[str, int | None] = {p: 640 for p in POLICIES} | {"full": None} | SPARSE_BUDGETS
LOCAL_CELLS = list(itertools.product(POLICIES, CONTROLLERS, (1, 2)))
RAY_CELLS = [(p, CONTROLLERS[i % len(CONTROLLERS)], 1 + i % 2) for i, p in enumerate(POLICIES)]
ERROR = "arbor-solve: error:"


def cell_id(cell) -> str:
    policy, controller, concurrency = cell
    return f"{policy}-{controller}-c{concurrency}"


@pytest.fixture(scope="module")
def matrix_data(tmp_path_factory) -> Path:
    return write_data_dir(tmp_path_factory.mktemp("matrix-data"))


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for this module: 2 CPUs, no GPUs (one CPU actor each), no dashboard."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False, object_store_memory=2**27)
    yield ray
    ray.shutdown()


@pytest.fixture
def restore_logging():
    """Hydra's app configures the root logger (a console handler on this test's captured stdout, a
    file handler in the run dir); put back what was there before, so later tests log as before."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


_loaded: dict[tuple, arbor_runtime.LoadedModel] = {}


@pytest.fixture
def memo_loader(monkeypatch):
    """The driver's loader, memoized by its arguments (loading the tiny model is ~1.5 s a cell)."""
    real = arbor_cli.build.load_model

    def load(**kwargs):
        key = tuple(sorted(kwargs.items()))
        if key not in _loaded:
            _loaded[key] = real(**kwargs)
        return _loaded[key]

    monkeypatch.setattr(arbor_cli.build, "load_model", load)


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails the test: bad values must be refused before the model loads."""

    def refuse(*args, **kwargs):
        pytest.fail(f"the model was loaded ({args} {kwargs}) before the bad value was refused")

    for module in (arbor_cli.build, arbor_runtime, arbor_runtime.loading):
        monkeypatch.setattr(module, "load_model", refuse, raising=False)


def arbor_solve(argv: list[str], monkeypatch, capfd) -> tuple[int, str, str]:
    """`arbor-solve ARGV` in this process; (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["arbor-solve", *argv])
    try:
        solve.main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    out, err = capfd.readouterr()
    return code, out, err


def cell_argv(data_dir: Path, run_dir: Path, policy: str, controller: str, concurrency: int, runner: str) -> list[str]:
    budget = BUDGETS[policy]
    argv = ["model=tiny-random", f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}", f"runner={runner}"]
    argv += [f"policy={policy}", f"controller={controller}", f"concurrency={concurrency}"]
    argv += [f"task.start={PROBLEMS[0]}", f"task.end={PROBLEMS[-1] + 1}"]
    return argv + ([f"policy.budget_tokens={budget}"] if budget is not None else [])


def strict_jsonl(path: Path) -> list[dict]:
    """Every line of a JSON-lines file, each of which must parse (a torn line fails the cell)."""
    assert path.is_file(), f"{path.name} missing"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def check_cell(cell, run_dir: Path, code: int, out: str, err: str, bytes_per_token: int) -> None:
    policy, controller, _ = cell
    assert code == 0, f"exit {code}\n{err[-4000:]}\n{out[-2000:]}"
    assert "Traceback" not in out + err, (out + err)[-4000:]
    for name in (RESULTS_FILE, EVENTS_FILE, TRACES_FILE):
        indices = [r["index"] for r in strict_jsonl(run_dir / name)]
        assert sorted(indices) == list(PROBLEMS), f"{name}: {indices}"
    budget = BUDGETS[policy]
    for row in strict_jsonl(run_dir / RESULTS_FILE):
        assert (row["error"], row["oom"]) == (None, False), row["index"]
        assert (row["policy"], row["controller"], row["budget_tokens"]) == (policy, controller, budget)
        assert row["prefill_tokens"] > 0 and row["peak_device_tokens"] > 0
        assert row["peak_device_bytes"] == row["peak_device_tokens"] * bytes_per_token
        assert row["peak_device_bytes"] <= row["pool_bytes"]
        if budget is not None:
            assert row["peak_device_tokens"] <= budget
            assert row["peak_device_bytes"] + row.get("peak_index_bytes", 0) <= budget * bytes_per_token


@pytest.fixture(scope="module")
def bytes_per_token(tiny) -> int:
    return KVShape.of(tiny.model).bytes_per_token


@pytest.mark.parametrize("cell", LOCAL_CELLS, ids=cell_id)
def test_local_cell(
    cell, matrix_data, tmp_path, monkeypatch, capfd, restore_logging, memo_loader, bytes_per_token
):  # fmt: skip
    code, out, err = arbor_solve(cell_argv(matrix_data, tmp_path, *cell, runner="local"), monkeypatch, capfd)
    check_cell(cell, tmp_path, code, out, err, bytes_per_token)


@pytest.mark.parametrize("cell", RAY_CELLS, ids=cell_id)
def test_ray_cell(
    cell, local_ray, matrix_data, tmp_path, monkeypatch, capfd, restore_logging, memo_loader, bytes_per_token
):  # fmt: skip
    code, out, err = arbor_solve(cell_argv(matrix_data, tmp_path, *cell, runner="ray"), monkeypatch, capfd)
    check_cell(cell, tmp_path, code, out, err, bytes_per_token)
    assert all(r["worker"] for r in strict_jsonl(tmp_path / RESULTS_FILE))  # searched by the actors


def test_the_ray_subset_covers_every_policy_controller_and_concurrency():
    assert {c[0] for c in RAY_CELLS} == set(POLICIES) and {c[1] for c in RAY_CELLS} == set(CONTROLLERS)
    assert {c[2] for c in RAY_CELLS} == {1, 2}


# ---- bad values: one line, exit 2, no traceback, the model never loaded ------------------------
def truncated_gguf(root: Path, size: int) -> Path:
    """The first ``size`` bytes of the shipped SmolLM2 GGUF (a header cut off mid-way)."""
    path = root / f"cut-{size}.gguf"
    with smollm2_gguf_path().open("rb") as fh:
        path.write_bytes(fh.read(size))
    return path


def empty_24csv(root: Path) -> Path:
    (root / "game24").mkdir(parents=True)
    (root / "game24" / "24.csv").write_text("")
    return root


def reference_run(root: Path) -> Path:
    """A finished full run of problems 900 and 901 (their peak KV), for ``policy.budget_ratio``."""
    root.mkdir()
    rows = [{"index": i, "oom": False, "error": None, "peak_device_tokens": 648} for i in (900, 901)]
    (root / RESULTS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


#: (id, overrides (a function of a scratch dir and the data dir), what the line must name)
BAD_VALUES = [
    ("n_generate=0", lambda tmp, data: ["controller.n_generate=0"], "n_generate"),
    ("breadth=0", lambda tmp, data: ["controller.breadth=0"], "breadth"),
    ("temperature=-1", lambda tmp, data: ["controller.temperature=-1"], "temperature"),
    ("temperature=nan", lambda tmp, data: ["controller.temperature=nan"], "temperature"),
    ("top_p=2", lambda tmp, data: ["controller.top_p=2"], "top_p"),
    ("seed=abc", lambda tmp, data: ["seed=abc"], "seed"),
    ("share_prefixes=maybe", lambda tmp, data: ["share_prefixes=maybe"], "share_prefixes"),
    ("sink_tokens=-1", lambda tmp, data: ["policy=streaming", "policy.sink_tokens=-1"], "sink_tokens"),
    ("host_budget_tokens=-1", lambda tmp, data: ["policy=arbor", "policy.host_budget_tokens=-1"], "host_budget_tokens"),
    ("budget_tokens=1e11", lambda tmp, data: ["policy.budget_tokens=100000000000"], "budget_tokens"),
    (
        "budget_ratio+budget_tokens",
        lambda tmp, data: [
            "policy=arbor",
            "policy.budget_tokens=600",
            "policy.budget_ratio=0.9",
            f"policy.budget_reference={reference_run(tmp / 'ref')}",
        ],
        "budget_ratio",
    ),  # fmt: skip
    ("kvp weights missing", lambda tmp, data: ["policy=kvp", f"policy.weights={tmp / 'no-such.pt'}"], "no-such.pt"),
    ("gguf cut to 100 B", lambda tmp, data: [f"model.spec={truncated_gguf(tmp, 100)}"], "cut-100.gguf"),
    ("gguf cut to 1 MB", lambda tmp, data: [f"model.spec={truncated_gguf(tmp, 2**20)}"], f"cut-{2**20}.gguf"),
    ("empty 24.csv", lambda tmp, data: [f"paths.data_dir={empty_24csv(tmp / 'data')}"], "24.csv"),
]


@pytest.mark.parametrize(("overrides", "names"), [b[1:] for b in BAD_VALUES], ids=[b[0] for b in BAD_VALUES])
def test_a_bad_value_is_one_line_and_exit_2_before_the_model_loads(
    overrides, names, matrix_data, tmp_path, monkeypatch, capfd, restore_logging, no_loading
):  # fmt: skip
    argv = ["model=tiny-random", f"paths.data_dir={matrix_data}", "task.start=900", "task.end=902"]
    argv += [*overrides(tmp_path, matrix_data), f"hydra.run.dir={tmp_path / 'run'}"]
    code, out, err = arbor_solve(argv, monkeypatch, capfd)
    check_refused(code, out, err, names)
    assert not (tmp_path / "run" / RESULTS_FILE).exists()


def test_ray_actors_asking_for_a_gpu_without_one_are_refused_before_the_model_loads(
    local_ray, matrix_data, tmp_path, monkeypatch, capfd, restore_logging, no_loading
):  # fmt: skip
    """runner.gpus_per_actor=1 where neither the machine nor the Ray instance has a GPU (it hung)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    argv = ["model=tiny-random", f"paths.data_dir={matrix_data}", "task.start=900", "task.end=902"]
    argv += ["runner=ray", "runner.gpus_per_actor=1", f"hydra.run.dir={tmp_path}"]
    code, out, err = arbor_solve(argv, monkeypatch, capfd)
    check_refused(code, out, err, "gpus_per_actor")


def check_refused(code: int, out: str, err: str, names: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit {code}\n{err[-3000:]}"
    assert "Traceback" not in out + err, (out + err)[-3000:]
    assert len(lines) == 1 and lines[0].startswith(ERROR), err[-3000:]
    assert names in lines[0], lines[0]
