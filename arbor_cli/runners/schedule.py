"""The driver's side of runner=ray: which problem goes to which actor, what a dead actor costs.

:class:`Schedule` is the one place that decides: it starts actors, hands problems to ready ones,
collects their records, retries the problems of dead actors on live ones and replaces dead actors,
within the run's bounds. It takes the ``ray`` module as an argument and never imports it.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any

from arbor_cli.build import Setup
from arbor_cli.runners.errors import RunnerError
from arbor_cli.runners.finished import Finished, unrun_row
from arbor_runtime.tasks.base import Problem

log = logging.getLogger(__name__)


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
        why = f"Ray actor {actor} failed on problem {problem.index} ({first_line(exc)})"
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
        self.deaths.append(first_line(exc))
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


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (Ray's span many lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
