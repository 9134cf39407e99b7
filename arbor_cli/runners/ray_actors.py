"""runner=ray: one run's problems spread over Ray actors, one model each; only the driver writes.

The driver (the ``arbor-solve`` process) builds the run as usual, then starts N :class:`SearchActor`
s (one GPU each when the cluster has GPUs, ``cpus_per_actor`` CPUs otherwise) and ships them the
built task, verifier and policies; each actor loads its own model. The driver hands out problems,
at most ``concurrency`` in flight per actor (they share the actor's runtime, as ``concurrency``
does locally), and each actor returns a problem's :class:`Finished` record as plain data, which the
driver writes. Its :class:`~arbor_cli.runners.schedule.Schedule` decides: a problem whose actor
died (killed, out of memory, its node lost) runs again on another actor, at most ``max_retries``
times, and is then recorded as an error; a dead actor is replaced by a new one (which loads its
model again), at most ``actor_restarts`` times in a run.

Ray is an optional extra (``pip install 'arbor-runtime[ray]'``): this module imports it lazily.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from arbor_cli.build import Setup, model_kwargs
from arbor_cli.runners.errors import RunnerError
from arbor_cli.runners.finished import Finished
from arbor_cli.runners.reaper import reaped
from arbor_cli.runners.schedule import Schedule, first_line
from arbor_cli.runners.search import solve
from arbor_runtime.tasks.base import Problem

log = logging.getLogger(__name__)
#: reapers of the local Ray instances this process started (:mod:`arbor_cli.runners.reaper`)
REAPERS: list[subprocess.Popen] = []
#: the fields of :class:`Setup` an actor receives from the driver (it loads its own model and
#: receives each problem with the call that searches it)
SHIPPED = ("task", "verifier", "policies")


#: seconds a cluster's address has to accept a connection, and then its GCS to answer, before the run is
#: refused (Ray's own retries take minutes)
CONNECT_SECONDS, GCS_SECONDS = 5.0, 20.0


def check_reachable(address: str) -> None:
    """A cluster address must answer before any work: ``host:port`` (a head's GCS) or ``ray://host:port``
    (Ray Client) must accept a TCP connection within :data:`CONNECT_SECONDS`, and a GCS address must
    answer as a Ray GCS within :data:`GCS_SECONDS` (a token it asks for counts as an answer: ``ray.init``
    reports that one). RunnerError in one line otherwise. ``auto`` is left to Ray, which fails at once
    when this node is in no cluster."""
    if address == "auto":
        return
    client = address.startswith("ray://")
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    valid = 'valid: a Ray head\'s "host:6379", "ray://host:10001", "auto", or null for a local instance'
    if not sep or not host or not port.isdigit():
        raise RunnerError(f"runner.address={address!r} is not an address; {valid}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise RunnerError(f"runner.address={address}: nothing answers there ({reason}); {valid}") from None
    if not client:
        _check_gcs(address, valid)


def _check_gcs(address: str, valid: str) -> None:
    """Ask the GCS at ``address`` for its cluster id, in a thread given :data:`GCS_SECONDS`."""
    import threading

    import_ray()
    from ray._raylet import GcsClient

    answer: list[BaseException | None] = []

    def ask() -> None:
        try:
            GcsClient(address=address)
            answer.append(None)
        except Exception as exc:  # Ray's own error types (RpcError, AuthenticationError)
            answer.append(exc)

    thread = threading.Thread(target=ask, daemon=True, name="ray-address-check")
    with _native_stderr_silenced():  # Ray's C++ client logs each failed try on fd 2
        thread.start()
        thread.join(GCS_SECONDS)
    if not answer:
        raise RunnerError(f"runner.address={address}: no Ray GCS answered within {GCS_SECONDS:g} s; {valid}")
    error = answer[0]
    if error is not None and type(error).__name__ != "AuthenticationError":
        raise RunnerError(f"runner.address={address}: not a Ray GCS ({first_line(error)}); {valid}")


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null inside (native libraries write there, not to ``sys.stderr``)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


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
        address: None starts a local Ray instance (with the ``local`` settings), whose processes
            end with this one however it ends (:mod:`~arbor_cli.runners.reaper`); ``"auto"``, a head's
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
        if not isinstance(self.log_to_driver, bool):
            raise ValueError(f"runner.log_to_driver={self.log_to_driver!r} must be true or false")
        for name in ("max_retries", "actor_restarts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"runner.{name}={value!r} must be an integer >= 0")
        self.local = dict(self.local or {})
        if self.address is not None:
            check_reachable(str(self.address))  # Ray itself retries an address nobody answers for minutes
        if self.address is None:  # a local instance: this machine's resources, known before Ray starts
            gpus = self.local.get("num_gpus")
            cpus = self.local.get("num_cpus")
            self.check_resources(
                torch_gpus() if gpus is None else gpus, (os.cpu_count() or 1) if cpus is None else cpus, "this machine"
            )

    def check_resources(self, gpus: float, cpus: float, where: str) -> None:
        """Refuse actors that could never be placed (Ray would wait for them forever)."""
        need = self.gpus_per_actor or 0
        if need > gpus:
            raise RunnerError(
                f"runner.gpus_per_actor={self.gpus_per_actor} but {where} has {gpus:g} GPU(s); valid: "
                f"{'0 or null (actors on CPU)' if not gpus else f'at most {gpus:g}, or null (1 each)'}"
            )
        if need and self.actors is not None and self.actors * need > gpus:
            raise RunnerError(
                f"runner.actors={self.actors} x runner.gpus_per_actor={self.gpus_per_actor} needs "
                f"{self.actors * need:g} GPUs, {where} has {gpus:g}; valid: at most {int(gpus // need)} actors, or null"
            )
        if self.cpus_per_actor > cpus:
            raise RunnerError(
                f"runner.cpus_per_actor={self.cpus_per_actor} but {where} has {cpus:g} CPU(s); valid: at most {cpus:g}"
            )

    def searches(self, setup: Setup, problems: list[Problem]) -> Iterator[Finished]:
        """One record per problem, as actors finish them; the actors are ended afterwards."""
        if not problems:
            return
        ray = self.connect()
        resources = ray.cluster_resources()
        self.check_resources(resources.get("GPU", 0), resources.get("CPU", 0), "the Ray cluster")
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
            if self.address is None:  # its processes end with this one, even when it is killed
                with reaped() as reaper:
                    ray.init(**kwargs)
                REAPERS.append(reaper)  # holds the pipe's write end until this process ends
            else:
                ray.init(**kwargs)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = "a local Ray instance" if self.address is None else f"runner.address={self.address}"
            raise RunnerError(f"cannot start {where}: {first_line(exc)}") from exc
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
        shipped = ray.put(shipment(setup))  # once for every actor
        options = {"num_cpus": self.cpus_per_actor, "num_gpus": self.gpus(ray), "max_concurrency": concurrency}
        cls = ray.remote(SearchActor).options(**options)
        log.info("Ray actors: %s", options)
        return lambda: cls.remote(shipped)


def shipment(setup: Setup) -> dict[str, Any]:
    """What every actor receives: the config as plain data and the :data:`SHIPPED` objects, which Ray
    pickles (cloudpickle); each must pickle without its process-local state (locks, runtimes)."""
    return {"cfg": OmegaConf.to_container(setup.cfg, resolve=True)} | {k: getattr(setup, k) for k in SHIPPED}


def torch_gpus() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
