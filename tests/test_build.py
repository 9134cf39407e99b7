"""The one builder: arbor-solve, trace recording and calibration get the same model options, task,
verifier, controller and seeds from a composed config."""

from __future__ import annotations

import pytest
from rich.console import Console

import arbor_cli.build as build_module
from arbor_cli.build import build, compose_config, model_kwargs
from benchmarks.cli import record_from_config
from benchmarks.trace import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def loads(monkeypatch, tiny) -> list[dict]:
    """Every ``load_model`` call the builder makes (it gets the tiny model)."""
    calls: list[dict] = []

    def fake(**kwargs):
        calls.append(kwargs)
        return tiny

    monkeypatch.setattr(build_module, "load_model", fake)
    return calls


def test_model_options_reach_load_model(loads, data_dir):
    over = ["model=tiny-random", "model.trust_remote_code=true", "model.dtype=float32", f"paths.data_dir={data_dir}"]
    setup = build(compose_config([*over, "task.end=901"]))
    assert loads == [{"spec": "tiny-random", "dtype": "float32", "trust_remote_code": True, "weights": "auto"}]
    shipped = model_kwargs(compose_config(["model=smollm2"]).model)
    assert shipped == {"spec": "smollm2", "trust_remote_code": False, "weights": "auto"}
    assert setup.verifier.name == "llm_value" and [p.index for p in setup.problems] == [900]


def test_trace_recording_builds_like_arbor_solve(loads, data_dir, tmp_path):
    """record_trace.py used to rebuild the model without trust_remote_code; now it goes through build()."""
    over = ["model=tiny-random", "model.trust_remote_code=true", f"paths.data_dir={data_dir}", "task.end=901"]
    paths = record_from_config([*over, "task.n_shots=1", "controller.n_generate=2", "seed=5"], tmp_path, Console())
    assert loads[0]["trust_remote_code"] is True
    trace = load_trace(paths[0])
    assert trace.meta["seed"] == 5 + 900 and trace.meta["controller_cfg"]["n_generate"] == 2


def test_setup_makes_one_runtime_and_controller_per_problem(tiny, data_dir):
    cfg = compose_config(["model=tiny-random", f"paths.data_dir={data_dir}", "task.start=900", "task.end=902"])
    setup = build(cfg, loaded=tiny)
    first, second = (setup.runtime(p) for p in setup.problems)
    assert first is not second and first.policy.name == "full"
    assert setup.seed(setup.problems[1]) == 901
    assert setup.runtime(setup.problems[0], policy="arbor").policy.name == "arbor"
    controller = setup.controller(first)
    assert controller.rt is first and controller.task is setup.task and controller.verifier is setup.verifier
