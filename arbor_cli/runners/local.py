"""runner=local: this run's problems searched in this process (what ``arbor-solve`` always did)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from arbor_cli.build import Setup
from arbor_cli.runners.finished import Finished
from arbor_cli.runners.search import solve
from arbor_runtime.tasks.base import Problem


class LocalRunner:
    """Searches in this process: one problem after another, each in a fresh runtime, or with
    ``concurrency=N`` (N > 1) N at once in threads sharing one runtime (their model steps batched
    together, one budget for all). Records come back as each problem finishes, in any order."""

    driver_device = None  # the searches run on this process's model: the configured device

    def searches(self, setup: Setup, problems: list[Problem]) -> Iterator[Finished]:
        """One :class:`Finished` record per problem of ``problems``, as each finishes."""
        concurrency = int(setup.cfg.get("concurrency", 1))
        if concurrency <= 1:
            for problem in problems:
                yield solve(setup, problem)
            return
        if not problems:
            return
        shared = setup.shared_runtime()
        pool = ThreadPoolExecutor(concurrency, thread_name_prefix="search")
        try:
            futures = [pool.submit(solve, setup, problem, shared) for problem in problems]
            for future in as_completed(futures):
                yield future.result()
        except BaseException as exc:  # Ctrl-C in this thread, or the caller stopped reading: the searches stop
            shared.engine.interrupt(exc if isinstance(exc, KeyboardInterrupt) else RuntimeError("run stopped"))
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
