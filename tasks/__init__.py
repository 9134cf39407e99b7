"""Task definitions: prompts, data loading, thought parsing, answer checks."""

from arbor_runtime.tasks.base import Problem, StepResult, Task

__all__ = ["Problem", "StepResult", "Task"]
