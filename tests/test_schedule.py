"""The Ray runner's Schedule against a scripted stand-in for Ray (no Ray needed): where retries go,
what happens when actors die or never start, and that every problem yields exactly one record."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from arbor_cli.runners import RunnerError
from arbor_cli.runners.schedule import Schedule
from arbor_runtime.tasks.base import Problem


class RayError(Exception):
    pass


class RayActorError(RayError):
    pass


class Ref:
    """An object ref: resolves to ``value``, or raises ``error``; refs are ready in the order made."""

    made = 0

    def __init__(self, value=None, error: Exception | None = None) -> None:
        self.value, self.error, self.seq = value, error, Ref.made
        Ref.made += 1


class FakeActor:
    """Solves every problem, unless it is dead (then its calls fail as a killed actor's do)."""

    def __init__(self, ray: FakeRay, number: int) -> None:
        self.ray, self.number = ray, number
        self.ready = SimpleNamespace(remote=self._ready)
        self.solve = SimpleNamespace(remote=self._solve)

    @property
    def dead(self) -> bool:
        return self.number in self.ray.dead

    def _ready(self) -> Ref:
        if self.number in self.ray.never_start:
            return Ref(error=RayActorError(f"actor {self.number}: model load failed\ndetails"))
        return Ref(f"host:{100 + self.number} (cpu, 1 threads)")

    def _solve(self, problem: Problem) -> Ref:
        self.ray.calls.append((self.number, problem.index))
        if self.number in self.ray.die_on_first_solve or problem.index in self.ray.poison:
            self.ray.dead.add(self.number)
        if self.dead:
            return Ref(error=RayActorError(f"The actor {self.number} died unexpectedly\nstack"))
        if (self.number, problem.index) in self.ray.flaky:
            return Ref(error=RayError("solve failed, the actor lives on"))
        row = {"index": problem.index, "solved": True, "error": None, "worker": f"actor{self.number}"}
        return Ref({"index": problem.index, "row": row, "trace": [], "events": [], "tree": None})


class FakeRay:
    """The calls Schedule makes: wait (the oldest ref is ready first), get, kill, exceptions."""

    exceptions = SimpleNamespace(RayError=RayError, RayActorError=RayActorError)

    def __init__(self, die_on_first_solve=(), never_start=(), poison=()) -> None:
        self.die_on_first_solve, self.never_start = set(die_on_first_solve), set(never_start)
        self.poison = set(poison)  # problems that kill whichever actor runs them
        self.flaky: set[tuple[int, int]] = set()  # (actor, problem): the call fails, the actor lives
        self.dead: set[int] = set()
        self.calls: list[tuple[int, int]] = []
        self.killed: list[int] = []
        self.started = 0

    def new_actor(self) -> FakeActor:
        self.started += 1
        return FakeActor(self, self.started - 1)

    def wait(self, refs, num_returns=1):
        ready = sorted(refs, key=lambda ref: ref.seq)[:num_returns]
        return ready, [ref for ref in refs if ref not in ready]

    def get(self, ref: Ref):
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor: FakeActor, no_restart: bool = True) -> None:
        self.killed.append(actor.number)


SETUP = SimpleNamespace(
    task=SimpleNamespace(name="fake"),
    verifier=SimpleNamespace(name="fake", label=None),
    loaded=SimpleNamespace(spec="tiny-random", weights="dense"),
    policies=SimpleNamespace(build=lambda index: SimpleNamespace(name="full", budget_tokens=None)),
)
PROBLEMS = [Problem(index=i, question=f"q{i}") for i in range(6)]


def schedule(ray: FakeRay, max_retries: int = 2, concurrency: int = 1) -> Schedule:
    return Schedule(ray, SETUP, ray.new_actor, concurrency, max_retries)


def records(ray: FakeRay, actors: int, restarts: int = 0, **kwargs) -> dict[int, dict]:
    sched = schedule(ray, **kwargs)
    try:
        out = list(sched.run(list(PROBLEMS), actors, restarts))
    finally:
        sched.close()
    assert sorted(f.index for f in out) == [p.index for p in PROBLEMS]  # each problem exactly once
    return {f.index: f.row for f in out}


def test_every_problem_once_spread_over_the_actors():
    ray = FakeRay()
    rows = records(ray, actors=2, concurrency=2)
    assert {r["worker"] for r in rows.values()} == {"actor0", "actor1"}
    assert all(r["retries"] == 0 for r in rows.values())
    assert sorted(ray.killed) == [0, 1]  # every actor started is ended afterwards


def test_a_dead_actors_problem_runs_again_on_another_actor():
    ray = FakeRay(die_on_first_solve={0})
    rows = records(ray, actors=2)
    first = next(index for actor, index in ray.calls if actor == 0)
    assert rows[first]["retries"] == 1 and rows[first]["worker"] == "actor1" and rows[first]["error"] is None
    assert [a for a, _ in ray.calls].count(0) == 1  # nothing more went to the dead actor
    assert all(r["error"] is None for r in rows.values())


def test_a_dead_actor_is_replaced_while_restarts_last():
    ray = FakeRay(die_on_first_solve={0})
    rows = records(ray, actors=1, restarts=1)
    assert ray.started == 2 and all(r["worker"] == "actor1" for r in rows.values())
    assert sum(r["retries"] for r in rows.values()) == 1


def test_with_no_live_actor_left_the_rest_are_recorded_as_errors():
    ray = FakeRay(die_on_first_solve={0})
    rows = records(ray, actors=1, restarts=0)
    assert rows[0]["retries"] == 1 and all(rows[i]["retries"] == 0 for i in range(1, 6))
    why = "no live Ray actor left to run it (last death: The actor 0 died unexpectedly)"
    assert all(r["error"] == why and not r["solved"] for r in rows.values())


def test_spent_retries_are_an_error_row():
    ray = FakeRay(poison={3})
    rows = records(ray, actors=3, max_retries=1)
    assert [i for i, r in rows.items() if r["error"]] == [3] and rows[3]["retries"] == 2
    assert "failed on problem 3" in rows[3]["error"] and "after 2 tries (runner.max_retries=1)" in rows[3]["error"]
    assert len({actor for actor, index in ray.calls if index == 3}) == 2  # tried on two different actors
    assert all(r["error"] is None for i, r in rows.items() if i != 3)


def test_no_actor_that_starts_is_a_runner_error():
    ray = FakeRay(never_start={0, 1})
    with pytest.raises(RunnerError, match="no Ray actor could start: actor 1: model load failed$"):
        records(ray, actors=2)


def test_an_actor_that_fails_to_start_leaves_the_work_to_the_others():
    ray = FakeRay(never_start={0})
    rows = records(ray, actors=2)
    assert all(r["worker"] == "actor1" and r["retries"] == 0 for r in rows.values())


def test_a_failed_problem_goes_to_another_actor_than_the_one_it_failed_on():
    ray = FakeRay()
    ray.flaky = {(0, 0)}
    rows = records(ray, actors=2)
    assert [actor for actor, index in ray.calls if index == 0] == [0, 1]
    assert rows[0]["retries"] == 1 and rows[0]["worker"] == "actor1" and rows[0]["error"] is None
    assert {r["worker"] for i, r in rows.items() if i != 0} == {"actor0", "actor1"}  # actor 0 still works
