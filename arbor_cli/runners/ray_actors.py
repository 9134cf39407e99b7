"""runner=ray: one run's problems spread over Ray actors, one model each; only the driver writes.

The driver (the ``arbor-solve`` process) builds the run as usual, then starts N :class:`SearchActor`
s (one GPU each when the cluster has GPUs, ``cpus_per_actor`` CPUs otherwise) and ships them the
built task, verifier and policies; each actor loads its own model. The driver hands out problems,
at most ``concurrency`` in flight per actor (they share the actor's runtime, as ``concurrency``
does locally), and each actor returns a problem's :class:`Finished` record as plain data, which the
driver writes. A problem whose actor died (killed, out of memory, its node lost) runs again on
another actor, at most ``max_retries`` times, and is then recorded as an error; a dead actor is
replaced by a new one (which loads its model again), at most ``actor_restarts`` times in a run.

Ray is an optional extra (``pip install 'arbor-runtime[ray]'``): this module imports it lazily.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from arbor_cli.build import Setup, model_kwargs
from arbor_cli.runners.errors import RunnerError
from arbor_cli.runners.finished import Finished, unrun_row
from arbor_cli.runners.search import solve
from tasks.base import Problem

log = logging.getLogger(__name__)
#: the fields of :class:`Setup` an actor receives from the driver (it loads its own model and
#: receives each problem with the call that searches it)
SHIPPED = ("task", "verifier", "policies")


def import_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise RunnerError(
            "runner=ray needs Ray, an optional extra: pip install 'arbor-runtime[ray]' (or use runner=local)"
        ) from exc
    return ray


@dataclass
class RayRunner:
    """Spreads problems over Ray actors (see the module docstring; settings in ``conf/runner/ray.yaml``).

    Attributes:
        address: None starts a local Ray instance (with the ``local`` settings); ``"auto"``, a head's
            ``"host:6379"`` or ``"ray://host:10001"`` (Ray Client) joins an existing cluster. A
            process that has already called ``ray.init`` keeps its connection.
        actors: how many; None = one per GPU of the cluster (``gpus_per_actor`` each), or without
            GPUs one per ``cpus_per_actor`` CPUs; never more than the problems need.
        cpus_per_actor / gpus_per_actor: each actor's Ray resources (None GPUs = 1 when the cluster
            has GPUs, else 0). Ray gives an actor ``OMP_NUM_THREADS`` = its CPUs.
        max_retries: how often a problem whose actor died runs again (on another actor when there is
            one) before it is recorded as an error.
        actor_restarts: how often in a run a dead actor is replaced by a new one (loading its model).
        log_to_driver: show the actors' own log output on this console.
        local: ``ray.init`` settings of a local instance (num_cpus, object_store_memory, ...).
    """

    address: str | None = None
    actors: int | None = None
    cpus_per_actor: float = 1
    gpus_per_actor: float | None = None
    max_retries: int = 2
    actor_restarts: int = 1
    log_to_driver: bool = False
    local: dict[str, Any] = field(default_factory=dict)
    #: the driver only tokenizes (budget checks) and writes: its model stays off the actors' GPUs
    driver_device: str | None = field(default="cpu", init=False)

    def __post_init__(self) -> None:
        import_ray()  # runner=ray without the extra fails before the model loads
        if self.actors is not None and (not isinstance(self.actors, int) or self.actors < 1):
            raise ValueError(f"runner.actors={self.actors!r} must be a positive integer or null (one per GPU / CPU)")
        if not self.cpus_per_actor or self.cpus_per_actor < 0:
            raise ValueError(f"runner.cpus_per_actor={self.cpus_per_actor!r} must be > 0")
        if self.gpus_per_actor is not None and self.gpus_per_actor < 0:
            raise ValueError(f"runner.gpus_per_actor={self.gpus_per_actor!r} must be >= 0 or null")
        for name in ("max_retries", "actor_restarts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"runner.{name}={value!r} must be an integer >= 0")
        self.local = dict(self.local or {})

    def searches(self, setup: Setup, problems: list[Problem]) -> Iterator[Finished]:
        """One record per problem, as actors finish them; the actors are ended afterwards."""
        if not problems:
            return
        ray = self.connect()
        concurrency = int(setup.cfg.get("concurrency", 1))
        schedule = Schedule(ray, setup, self.actor_factory(ray, setup, concurrency), concurrency, self.max_retries)
        try:
            yield from schedule.run(problems, self.count(ray, len(problems), concurrency), self.actor_restarts)
        finally:
            schedule.close()

    def connect(self) -> Any:
        """Ray, initialized: a new local instance or the cluster at ``address``."""
        ray = import_ray()
        if ray.is_initialized():
            return ray
        kwargs: dict[str, Any] = {"log_to_driver": self.log_to_driver}
        if self.address is None:  # "local": a new instance, never one another process started
            kwargs |= {"address": "local"} | {k: v for k, v in self.local.items() if v is not None}
        else:
            kwargs["address"] = self.address
        try:
            ray.init(**kwargs)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = "a local Ray instance" if self.address is None else f"runner.address={self.address}"
            raise RunnerError(f"cannot start {where}: {_first_line(exc)}") from exc
        return ray

    def gpus(self, ray: Any) -> float:
        """GPUs per actor: as configured, else 1 when the cluster has any."""
        if self.gpus_per_actor is not None:
            return self.gpus_per_actor
        return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0

    def count(self, ray: Any, n_problems: int, concurrency: int) -> int:
        """How many actors: as configured or as the cluster's GPUs / CPUs allow, at most what the problems need."""
        if self.actors is not None:
            n = self.actors
        else:
            resources, gpus = ray.cluster_resources(), self.gpus(ray)
            n = int(resources.get("GPU", 0) // gpus) if gpus else int(resources.get("CPU", 1) // self.cpus_per_actor)
        return max(1, min(n, math.ceil(n_problems / concurrency)))

    def actor_factory(self, ray: Any, setup: Setup, concurrency: int) -> Callable[[], Any]:
        """A function that starts one actor (it loads its model; :class:`Schedule` waits for it)."""
        cfg = OmegaConf.to_container(setup.cfg, resolve=True)
        shipped = ray.put({"cfg": cfg} | {k: getattr(setup, k) for k in SHIPPED})  # once for every actor
        options = {"num_cpus": self.cpus_per_actor, "num_gpus": self.gpus(ray), "max_concurrency": concurrency}
        cls = ray.remote(SearchActor).options(**options)
        log.info("Ray actors: %s", options)
        return lambda: cls.remote(shipped)


class SearchActor:
    """One Ray actor: its own model, and with ``concurrency`` > 1 one runtime its searches share."""

    def __init__(self, shipped: dict[str, Any]) -> None:
        from arbor_runtime import load_model

        cfg: DictConfig = OmegaConf.create(shipped["cfg"])
        loaded = load_model(**model_kwargs(cfg.model))
        self.setup = Setup(cfg=cfg, loaded=loaded, problems=[], **{k: shipped[k] for k in SHIPPED})
        self.shared = self.setup.shared_runtime() if int(cfg.get("concurrency", 1)) > 1 else None
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def ready(self) -> str:
        """Where this actor runs: host, process, device, threads."""
        import torch

        return f"{self.worker} ({self.setup.loaded.device}, {torch.get_num_threads()} threads)"

    def solve(self, problem: Problem) -> dict[str, Any]:
        """Search ``problem``; its :class:`Finished` record as plain data (``row.worker`` says where)."""
        finished = solve(self.setup, problem, self.shared)
        finished.row["worker"] = self.worker
        return finished.to_dict()


class Schedule:
    """The driver's side: starts actors, hands problems to ready ones, collects records, decides retries.

    The one place that decides where a problem runs: at most ``concurrency`` problems per actor,
    a retried problem on an actor it has not failed on whenever one is alive, and the next problem
    sent out before the record just received is written (so no actor waits on the driver's disk).
    """

    def __init__(self, ray: Any, setup: Setup, new_actor: Callable[[], Any], concurrency: int, max_retries: int):
        self.ray, self.setup, self.new_actor = ray, setup, new_actor
        self.concurrency, self.max_retries = concurrency, max_retries
        self.actors: dict[int, Any] = {}  # every actor started (dead ones too, to end them at close)
        self.starting: dict[Any, int] = {}  # ready() ref -> actor
        self.ready: set[int] = set()
        self.workers: dict[int, str] = {}  # actor -> where it runs (ready()'s answer: host:pid, device)
        self.load: dict[int, int] = {}
        self.todo: deque[Problem] = deque()
        self.running: dict[Any, tuple[int, Problem]] = {}  # solve() ref -> (actor, problem)
        self.failed_on: dict[int, list[int]] = defaultdict(list)  # problem index -> actors it failed on
        self.deaths: list[str] = []  # why actors died, first line each
        self.ever_ready, self.restarts = False, 0

    def run(self, problems: list[Problem], actors: int, restarts: int = 0) -> Iterator[Finished]:
        """One record per problem (searched, or an error once its retries are spent), from ``actors``
        actors; up to ``restarts`` dead ones are replaced."""
        self.todo.extend(problems)
        self.restarts = restarts
        for _ in range(actors):
            self.start()
        while self.todo or self.running:
            self.dispatch()
            if not self.running and not self.starting:
                yield from self.abandon()
                return
            ref = self.ray.wait([*self.running, *self.starting], num_returns=1)[0][0]
            if ref in self.starting:
                self.started(ref)
                continue
            finished = self.collect(ref)
            self.dispatch()
            if finished is not None:
                yield finished

    def start(self) -> None:
        """Start one actor; it joins once its model is loaded."""
        actor = len(self.actors)
        self.actors[actor] = self.new_actor()
        self.load[actor] = 0
        self.starting[self.actors[actor].ready.remote()] = actor

    def dispatch(self) -> None:
        """Send queued problems to ready actors with room, each to an actor it has not failed on
        when one is alive (it waits in the queue for one while they are busy)."""
        for problem in list(self.todo):
            free = [i for i in self.ready if self.load[i] < self.concurrency]
            if not free:
                return
            avoid = self.failed_on.get(problem.index, ())
            fresh = [i for i in free if i not in avoid]
            if not fresh and any(i not in avoid for i in self.ready):
                continue
            actor = min(fresh or free, key=lambda i: (self.load[i], i))
            self.todo.remove(problem)
            self.running[self.actors[actor].solve.remote(problem)] = (actor, problem)
            self.load[actor] += 1

    def started(self, ref: Any) -> None:
        """An actor finished loading its model, or failed to (then it is dropped, not replaced)."""
        actor = self.starting.pop(ref)
        try:
            where = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            self.drop(actor, exc, replace=False)
            if not self.ever_ready and not self.starting:
                raise RunnerError(f"no Ray actor could start: {self.deaths[-1]}") from exc
            return
        log.info("Ray actor %d ready: %s", actor, where)
        self.workers[actor] = where
        self.ready.add(actor)
        self.ever_ready = True

    def collect(self, ref: Any) -> Finished | None:
        """The record of a finished problem; None when its actor failed and it was queued again."""
        actor, problem = self.running.pop(ref)
        self.load[actor] -= 1
        try:
            record = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:  # the actor died (killed, OOM, node lost)
            self.drop(actor, exc, replace=True)
            return self.failed(problem, actor, exc)
        except self.ray.exceptions.RayError as exc:  # solve itself raised (a search's own errors are rows)
            return self.failed(problem, actor, exc)
        finished = Finished.from_dict(record)
        finished.row["retries"] = len(self.failed_on.get(problem.index, ()))
        return finished

    def failed(self, problem: Problem, actor: int, exc: Exception) -> Finished | None:
        """Queue ``problem`` again, or record it as an error once its retries are spent."""
        self.failed_on[problem.index].append(actor)
        tries = len(self.failed_on[problem.index])
        why = f"Ray actor {actor} failed on problem {problem.index} ({_first_line(exc)})"
        if tries > self.max_retries:
            log.error("%s; retries spent (runner.max_retries=%d): recorded as an error", why, self.max_retries)
            return self.error(problem, f"{why}; after {tries} tries (runner.max_retries={self.max_retries})")
        log.warning("%s; retry %d of %d", why, tries, self.max_retries)
        self.todo.appendleft(problem)
        return None

    def drop(self, actor: int, exc: Exception, replace: bool) -> None:
        """An actor is dead: no more problems go to it; a new one takes its place while restarts last.
        (Its other problems in flight fail on their own and are queued again.)"""
        if actor not in self.ready and replace:
            return  # already dropped by another of its problems
        self.ready.discard(actor)
        self.deaths.append(_first_line(exc))
        log.warning("Ray actor %d is dead: %s", actor, self.deaths[-1])
        if replace and self.restarts > 0:
            self.restarts -= 1
            self.start()

    def abandon(self) -> Iterator[Finished]:
        """Every actor is dead: what is left is recorded as errors (never silently lost)."""
        why = f"no live Ray actor left to run it (last death: {self.deaths[-1] if self.deaths else 'unknown'})"
        while self.todo:
            yield self.error(self.todo.popleft(), why)

    def error(self, problem: Problem, why: str) -> Finished:
        row = unrun_row(self.setup, problem, why, oom=False)
        return Finished(problem.index, row | {"retries": len(self.failed_on.get(problem.index, ()))})

    def close(self) -> None:
        """End every actor this schedule started (their resources go back to the cluster)."""
        for actor in self.actors.values():
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                log.debug("Ray actor already gone", exc_info=True)


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (Ray's span many lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
