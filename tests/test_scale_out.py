"""Scale out: runner=ray spreads a run's problems over Ray actors and records each exactly once (also
when an actor is killed mid-run, and on a rerun in the same dir); Hydra's submitit launcher runs a
sweep's jobs; bad runner settings end with one clear line.

Tests marked ``needs_ray`` skip only when the ``ray`` extra is not installed (``make setup``
installs it). They share one small local Ray instance (2 CPUs, no dashboard), shut down at the end.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from arbor_cli.build import compose_config
from arbor_cli.results import EVENTS_FILE, RESULTS_FILE, TRACES_FILE, read_jsonl
from arbor_cli.run import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")
needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="the ray extra is not installed: pip install '.[ray]'"
)
SIX = ("task.start=900", "task.end=906")


def cfg(data_dir, run_dir, *extra):
    """The tiny model on the synthetic game24 slice, one thought kept per step, scored by the exact
    solver (no value prompts: fast searches)."""
    base = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={run_dir}", "controller.n_generate=2"]
    return compose_config([*base, "controller.breadth=1", "verifier=game24_oracle", *extra])


def on_ray(*extra):
    return ("runner=ray", "runner.actors=2", *extra)


def indices(run_dir: Path, name: str = RESULTS_FILE) -> list[int]:
    return [r["index"] for r in read_jsonl(run_dir / name)]


def rows(run_dir: Path) -> dict[int, dict]:
    return {r["index"]: r for r in read_jsonl(run_dir / RESULTS_FILE)}


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for this module: 2 CPUs (one actor each), no dashboard; shut down after."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=2**27)
    yield ray
    ray.shutdown()


@needs_ray
def test_six_problems_on_two_actors_are_each_recorded_once(local_ray, data_dir, tmp_path, monkeypatch):
    from arbor_cli.runners.schedule import Schedule

    started, start = [], Schedule.start
    monkeypatch.setattr(Schedule, "start", lambda self: started.append(1) or start(self))
    assert run(cfg(data_dir, tmp_path / "ray", *SIX, *on_ray()), Console(width=150)) == 0
    assert len(started) == 2
    for name in (RESULTS_FILE, EVENTS_FILE, TRACES_FILE):
        assert sorted(indices(tmp_path / "ray", name)) == list(range(900, 906)), name
    got = rows(tmp_path / "ray")
    # searches take a fraction of a second: under load one actor may finish all six before the
    # other has loaded its model (spreading is checked deterministically in test_schedule.py)
    assert 1 <= len({r["worker"] for r in got.values()}) <= 2
    assert all(r["error"] is None and r["retries"] == 0 for r in got.values())
    assert all((tmp_path / "ray" / "trees" / f"{i}.json").is_file() for i in got)
    # the same rows as this process searching them itself: seeds follow the problem, not the worker
    assert run(cfg(data_dir, tmp_path / "local", *SIX), Console(width=150)) == 0
    local = rows(tmp_path / "local")
    for key in ("answer", "solved", "prefill_tokens", "decode_tokens", "peak_device_tokens", "best_path"):
        assert {i: r[key] for i, r in got.items()} == {i: r[key] for i, r in local.items()}, key
    # concurrency=3 per actor: three searches share each actor's runtime, with the same results
    assert run(cfg(data_dir, tmp_path / "ray3", *SIX, *on_ray("concurrency=3")), Console(width=150)) == 0
    assert sorted(indices(tmp_path / "ray3")) == list(range(900, 906))
    shared = rows(tmp_path / "ray3")
    for key in ("answer", "solved", "decode_tokens", "best_path"):
        assert {i: r[key] for i, r in shared.items()} == {i: r[key] for i, r in local.items()}, key
    # a later search in an actor's runtime attaches below the task prompt another one stores: it
    # prefills exactly the shared tokens fewer (prefix sharing), and at least one search did
    prompt = {i: r["prefill_tokens"] + r["prefix_prefill_saved_tokens"] for i, r in shared.items()}
    assert prompt == {i: r["prefill_tokens"] + r["prefix_prefill_saved_tokens"] for i, r in local.items()}
    assert any(r["prefix_prefill_saved_tokens"] > 0 for r in shared.values())


@needs_ray
def test_arbors_part_switches_reach_the_actors(local_ray, data_dir, tmp_path):
    """policy.* switches travel with the policy the actors build: rehydration off and a pin subset give
    on Ray the rows this process gives (no rehydration, recomputation instead), and differ from arbor's
    default there."""
    budget = ("policy=arbor", "policy.budget_tokens=620", "task.end=902")  # the prompt ~600 tokens: evicts
    parts = (*budget, "policy.host_tier=false", "policy.msve=off", "policy.pins=[question]")
    assert run(cfg(data_dir, tmp_path / "ray", *parts, *on_ray()), Console(width=150)) == 0
    assert run(cfg(data_dir, tmp_path / "local", *parts), Console(width=150)) == 0
    assert run(cfg(data_dir, tmp_path / "default", *budget, *on_ray()), Console(width=150)) == 0
    got, local, default = rows(tmp_path / "ray"), rows(tmp_path / "local"), rows(tmp_path / "default")
    keys = ("answer", "prefill_tokens", "evicted_tokens", "rehydrated_tokens", "recomputed_tokens", "peak_host_tokens")
    for key in keys:
        assert {i: r[key] for i, r in got.items()} == {i: r[key] for i, r in local.items()}, key
    assert all(r["rehydrated_tokens"] == 0 and r["peak_host_tokens"] == 0 for r in got.values())
    assert sum(r["recomputed_tokens"] for r in got.values()) > 0
    assert sum(r["rehydrated_tokens"] for r in default.values()) > 0  # the default rehydrates instead


@needs_ray
def test_a_rerun_in_the_same_dir_searches_only_what_is_not_done(local_ray, data_dir, tmp_path, monkeypatch):
    assert run(cfg(data_dir, tmp_path, "task.start=900", "task.end=903", *on_ray()), Console(width=150)) == 0
    before = (tmp_path / RESULTS_FILE).read_text()
    assert run(cfg(data_dir, tmp_path, *SIX, *on_ray()), Console(width=150)) == 0
    assert (tmp_path / RESULTS_FILE).read_text().startswith(before)  # done rows kept as they were
    assert sorted(indices(tmp_path)) == list(range(900, 906))  # 900-902 not searched again, 903-905 added
    from arbor_cli.runners.ray_actors import RayRunner

    def no_ray(self):
        raise AssertionError("nothing is left to search: Ray must not be started")

    monkeypatch.setattr(RayRunner, "connect", no_ray)
    assert run(cfg(data_dir, tmp_path, *SIX, *on_ray()), Console(width=150)) == 0
    assert sorted(indices(tmp_path)) == list(range(900, 906))


def every_task_and_verifier() -> list[tuple[str, str]]:
    """Every task config with every verifier it lists (conf/task x conf/verifier)."""
    from hydra.utils import get_class

    conf = Path(__file__).resolve().parents[1] / "conf"
    verifiers = sorted(p.stem for p in (conf / "verifier").glob("*.yaml"))
    pairs = []
    for task in sorted(p.stem for p in (conf / "task").glob("*.yaml")):
        listed = get_class(compose_config([f"task={task}"]).task._target_).verifiers  # no data read
        pairs += [(task, v) for v in verifiers if v in listed]
    return pairs


@needs_ray
@pytest.mark.parametrize(("task", "verifier"), every_task_and_verifier())
def test_what_the_driver_ships_to_actors_survives_cloudpickle(task, verifier, tiny, data_dir):
    """Ray pickles the shipment with cloudpickle: every task, verifier and the policies factory must
    survive it (a lock in LLMValueVerifier made runner=ray fail with the default config)."""
    from ray import cloudpickle

    from arbor_cli.budget import PolicyFactory
    from arbor_cli.build import Setup, build_task, build_verifier
    from arbor_cli.runners.ray_actors import SHIPPED, shipment

    config = compose_config(["model=tiny-random", f"paths.data_dir={data_dir}", f"task={task}", f"verifier={verifier}"])
    built = build_task(config)
    problems = built.problems()[:2]
    setup = Setup(config, built, build_verifier(config, built), problems, PolicyFactory(config.policy, problems), tiny)
    setup.controller(setup.runtime(problems[0]))  # bound to a runtime, as after a local search
    copy = cloudpickle.loads(cloudpickle.dumps(shipment(setup)))
    assert set(copy) == {"cfg", *SHIPPED}
    assert [p.question for p in copy["task"].problems()] == [p.question for p in built.problems()]
    assert type(copy["verifier"]) is type(setup.verifier) and copy["verifier"].name == verifier
    assert copy["policies"].build(problems[0].index).name == setup.policies.build(problems[0].index).name


@needs_ray
def test_a_pickled_llm_value_verifier_leaves_its_runtime_behind_and_scores_the_same(tiny, data_dir):
    from ray import cloudpickle

    from arbor_runtime import Runtime
    from arbor_runtime.tasks.game24 import Game24Task, legal_steps
    from arbor_runtime.verifiers import LLMValueVerifier

    task = Game24Task(data_dir=str(data_dir), start=900, end=901)
    problem = task.problems()[0]
    start = task.initial_state(problem)
    state = task.step(problem, start, legal_steps(start)[0])  # an open state: scoring it asks the model
    verifier = LLMValueVerifier()
    verifier.bind(Runtime(tiny, seed=0), task)
    score = verifier.score(problem, state)
    copy = cloudpickle.loads(cloudpickle.dumps(verifier))
    assert copy.runtime is None and copy.roots == {} and copy.cache == {}  # process-local state stays behind
    assert copy._lock is not verifier._lock and copy._lock.acquire(blocking=False)  # a new, free lock
    copy._lock.release()
    copy.bind(Runtime(tiny, seed=0), task)
    assert copy.score(problem, state) == score and copy.evaluations == verifier.evaluations == 1


@needs_ray
def test_the_default_config_runs_on_two_actors(local_ray, data_dir, tmp_path):
    """`arbor-solve runner=ray runner.actors=2` with the default task (game24) and its default verifier
    (llm_value): every problem recorded once, no errors, the same rows as searching them here."""
    base = ["model=tiny-random", f"paths.data_dir={data_dir}", "task.start=900", "task.end=904"]
    assert run(compose_config([*base, f"run_dir={tmp_path / 'ray'}", *on_ray()]), Console(width=150)) == 0
    for name in (RESULTS_FILE, EVENTS_FILE, TRACES_FILE):
        assert sorted(indices(tmp_path / "ray", name)) == list(range(900, 904)), name
    got = rows(tmp_path / "ray")
    assert all(r["verifier"] == "llm_value" and r["error"] is None and r["retries"] == 0 for r in got.values())
    assert run(compose_config([*base, f"run_dir={tmp_path / 'local'}"]), Console(width=150)) == 0
    local = rows(tmp_path / "local")
    for key in ("answer", "solved", "prefill_tokens", "decode_tokens", "peak_device_tokens", "best_path"):
        assert {i: r[key] for i, r in got.items()} == {i: r[key] for i, r in local.items()}, key


def kill_one_busy_actor(monkeypatch, killed: list[int]) -> None:
    """Fault injection: once a record is back, the next time an actor holds a problem while two or
    more wait, SIGKILL that actor's process (it dies mid-search, or fails the next problem it is sent)."""
    from arbor_cli.runners.schedule import Schedule

    collect, dispatch, records = Schedule.collect, Schedule.dispatch, []

    def collect_and_count(self, ref):
        records.append(collect(self, ref))
        return records[-1]

    def dispatch_then_kill(self):
        dispatch(self)
        if records and not killed and self.running and len(self.todo) >= 2:
            actor = next(iter(self.running.values()))[0]
            pid = int(self.workers[actor].split()[0].rsplit(":", 1)[1])  # "host:pid (device, threads)"
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    monkeypatch.setattr(Schedule, "collect", collect_and_count)
    monkeypatch.setattr(Schedule, "dispatch", dispatch_then_kill)


@needs_ray
def test_a_killed_actor_still_ends_with_every_problem_recorded_once(local_ray, data_dir, tmp_path, monkeypatch):
    killed: list[int] = []
    kill_one_busy_actor(monkeypatch, killed)
    assert run(cfg(data_dir, tmp_path, *SIX, *on_ray()), Console(width=150)) == 0
    assert len(killed) == 1
    for name in (RESULTS_FILE, EVENTS_FILE, TRACES_FILE):
        assert sorted(indices(tmp_path, name)) == list(range(900, 906)), name
    got = rows(tmp_path).values()
    assert all(r["error"] is None for r in got)  # the killed actor's problem ran again elsewhere
    retried = [r for r in got if r["retries"] > 0]
    assert retried and all(f":{killed[0]} " not in r["worker"] + " " for r in retried)


@needs_ray
def test_a_problem_whose_retries_are_spent_is_recorded_as_an_error(local_ray, data_dir, tmp_path, monkeypatch):
    killed: list[int] = []
    kill_one_busy_actor(monkeypatch, killed)
    extra = on_ray("runner.max_retries=0", "runner.actor_restarts=0")
    assert run(cfg(data_dir, tmp_path, *SIX, *extra), Console(width=150)) == 1  # a problem failed: not exit 0
    assert sorted(indices(tmp_path)) == list(range(900, 906))  # never silently lost
    errors = [r for r in rows(tmp_path).values() if r["error"]]
    assert len(errors) == 1 and errors[0]["retries"] == 1 and not errors[0]["solved"]
    assert "failed on problem" in errors[0]["error"] and "runner.max_retries=0" in errors[0]["error"]


@needs_ray
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("runner.actors=0", "runner.actors=0 must be a positive integer"),
        ("runner.actors=two", "runner.actors='two' must be a positive integer"),
        ("runner.max_retries=-1", "runner.max_retries=-1 must be an integer >= 0"),
        ("runner.cpus_per_actor=0", "runner.cpus_per_actor=0 must be > 0"),
    ],
)
def test_bad_runner_values_end_with_one_clear_line(override, message, data_dir, tmp_path, capsys):
    assert run(cfg(data_dir, tmp_path, "task.end=901", "runner=ray", override)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("arbor-solve: error:") and message in err and "\n" not in err
    assert not (tmp_path / RESULTS_FILE).exists()


def test_runner_ray_without_ray_says_how_to_install_it(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert run(cfg(data_dir, tmp_path, "task.end=901", "runner=ray")) == 2
    err = capsys.readouterr().err.strip()
    assert "runner=ray needs Ray" in err and "arbor-runtime[ray]" in err and "\n" not in err


def test_an_unknown_runner_names_the_valid_ones(tmp_path):
    """Unknown config-group options (as for every group): one line naming the valid ones, exit 2."""
    cmd = [sys.executable, "-m", "arbor_cli.solve", "runner=slurm", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "arbor-solve: error: runner='slurm' is not an option of runner; valid: local, ray"


def test_two_job_sweep_with_the_submitit_local_launcher(data_dir, tmp_path):
    """hydra/launcher=submitit_local: each job in its own process; both job dirs get their results."""
    import hydra_plugins.hydra_submitit_launcher  # noqa: F401  (the sweep extra installs it)

    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "arbor_cli.solve", "-m", "model=tiny-random", f"paths.data_dir={data_dir}",
        "task.start=900", "task.end=901", "controller=bfs,best_first",
        "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "hydra.launcher.cpus_per_task=1",
        f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {p.parent.name.split(",")[0]: p for p in sweep.rglob(RESULTS_FILE)}
    assert set(jobs) == {"controller=bfs", "controller=best_first"}
    assert all([r["index"] for r in read_jsonl(p)] == [900] for p in jobs.values())


@pytest.mark.parametrize(
    ("launcher", "target", "expected"),
    [
        ("slurm", "SlurmLauncher", {"gpus_per_node": 1, "tasks_per_node": 1}),
        ("ray_cluster", "RayLauncher", {"ray.init.object_store_memory": None, "ray.remote.max_calls": 1}),
    ],
)
def test_the_shipped_launcher_configs_compose_on_their_plugins(launcher, target, expected):
    """conf/hydra/launcher/*.yaml extend the plugins' own configs (a typo in a key fails here)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="arbor_cli.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    for key, value in expected.items():
        assert OmegaConf.select(cfg.hydra.launcher, key, default="missing") == value, key
