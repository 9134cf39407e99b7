"""Benchmarks: outside the installed package; they import arbor_runtime like a user would.

Run them from the repository root through their scripts (``scripts/bench_*.py``, ``record_trace.py``,
``replay_trace.py``, ``plot_memory.py``), which put the root on ``sys.path``, or as
``python -m benchmarks.<module>`` from the root. One module per benchmark, with its helpers:

- :mod:`~benchmarks.trace` / :mod:`~benchmarks.replay`: a recorded ``full`` search as JSON; its
  teacher-forced replay under any policy and budget, in lockstep with full.
- :mod:`~benchmarks.plots`: resident device KV per step; :mod:`~benchmarks.speed`: the same tree built
  by the runtime, naively (:mod:`~benchmarks.naive`), with a prefix cache.
- :mod:`~benchmarks.budgets`, :mod:`~benchmarks.concurrency`, :mod:`~benchmarks.memprof`: live
  searches at shrinking budgets, problems per hour by concurrency, what a call allocates.
- :mod:`~benchmarks.linear` (+ ``linear_cli``, ``kvpress_side``), :mod:`~benchmarks.stats_cost`,
  :mod:`~benchmarks.sparse` (+ ``sparse_cli``), :mod:`~benchmarks.rehydrate`: linear fidelity next to
  kvpress, the cost of attention statistics, sparse decode attention, returning to a compressed branch.
- :mod:`~benchmarks.gpu_check` (random-weight models from :mod:`~benchmarks.random_model`): the device check.
- :mod:`~benchmarks.longctx`: the long-context suite. :mod:`~benchmarks.cli`, :mod:`~benchmarks.report`:
  the scripts' bodies and their tables.
"""
