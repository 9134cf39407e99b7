"""The engine package: the driver loop (:mod:`.core`), the scheduler that decides every step
(:mod:`.scheduler`), over the pure memory planner (:mod:`arbor_runtime.planner`).

The names importable from ``arbor_runtime.engine`` before it became a package stay importable here.
"""

from arbor_runtime.engine.core import PAGE, Account, Engine, EngineHost, ExpandJob, Work
from arbor_runtime.engine.scheduler import Admitted, Scheduler, StepPlan

__all__ = ["PAGE", "Account", "Admitted", "Engine", "EngineHost", "ExpandJob", "Scheduler", "StepPlan", "Work"]
