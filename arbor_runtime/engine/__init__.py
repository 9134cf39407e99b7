"""The engine package, one module per role (each name is imported from its module):

- core.py: the :class:`~arbor_runtime.engine.core.Engine` (submission, the driver's cycle, the
  decode step's forward and postprocess);
- work.py: the works it runs (a public operation, an expansion) and the accounts they count to;
- scheduler.py: the :class:`~arbor_runtime.engine.scheduler.Scheduler`, which decides every step
  and admission in plans without side effects, over the pure memory planner
  (:mod:`arbor_runtime.planner`);
- executor.py: the :class:`~arbor_runtime.engine.executor.Executor`, which carries the plans out;
- turns.py: which searches take turns when the budget cannot hold them all;
- prefill.py: prefills and recomputes.
"""
