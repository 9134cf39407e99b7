"""Runners: where a run's problems are searched (``runner=`` in the config, ``conf/runner/``).

- ``local`` (:class:`~arbor_cli.runners.local.LocalRunner`): in this process, one problem after
  another or ``concurrency`` at once in one shared runtime.
- ``ray`` (:class:`~arbor_cli.runners.ray_actors.RayRunner`): spread over Ray actors, one model
  each, on this machine or an existing cluster (the ``ray`` extra).

Every runner yields one JSON-able :class:`~arbor_cli.runners.finished.Finished` record per problem;
only the driver (:func:`arbor_cli.run.solve_all`) writes them, so each problem is written once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from omegaconf import DictConfig

from arbor_cli.build import instantiate_user
from arbor_cli.runners.errors import RunnerError
from arbor_cli.runners.finished import Finished

if TYPE_CHECKING:
    from arbor_cli.build import Setup
    from arbor_runtime.tasks.base import Problem

__all__ = ["Finished", "Runner", "RunnerError", "build_runner"]


class Runner(Protocol):
    """Searches problems somewhere and yields their records as each finishes (in any order).

    ``driver_device``: where the driver process loads its copy of the model (None: the configured
    device); a runner whose workers load their own puts it on the CPU, off their accelerators.
    """

    driver_device: str | None

    def searches(self, setup: Setup, problems: list[Problem]) -> Iterator[Finished]: ...


def build_runner(cfg: DictConfig) -> Runner:
    """The configured runner (``cfg.runner``; the local one when the config has none). Cheap: a
    runner connects to its workers only when it has problems to search."""
    node = cfg.get("runner")
    if node is None:
        from arbor_cli.runners.local import LocalRunner

        return LocalRunner()
    return instantiate_user(node)
