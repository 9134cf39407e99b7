"""ArborKV runtime: tree-structured LLM reasoning with per-thought-block KV cache management."""

from arbor_runtime.errors import (
    ArborError,
    BudgetError,
    KVBudgetExceeded,
    ModelSpecError,
    NodeError,
    TokenIdError,
    UnsupportedModelError,
)
from arbor_runtime.loading import LoadedModel, load_model
from arbor_runtime.metrics import RuntimeMetrics
from arbor_runtime.policies import Policy, build_policy
from arbor_runtime.runtime import Runtime
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import Node

__all__ = [
    "ArborError",
    "BudgetError",
    "KVBudgetExceeded",
    "LoadedModel",
    "ModelSpecError",
    "Node",
    "NodeError",
    "Policy",
    "Runtime",
    "RuntimeMetrics",
    "SamplingParams",
    "TokenIdError",
    "UnsupportedModelError",
    "build_policy",
    "load_model",
]


# A source checkout run without installing it (the repository on PYTHONPATH: scripts/gpu_check.sh,
# the device run, a worktree next to another checkout's editable install): the folders that
# pyproject.toml installs as arbor_runtime.controllers, .tasks and .verifiers are this package's
# siblings, so subpackages are looked up there too. An installed wheel has no pyproject.toml beside
# the package: nothing changes there.
def _source_checkout() -> str | None:
    import os

    root = os.path.dirname(__path__[0])
    return root if all(os.path.exists(f"{root}/{n}") for n in ("pyproject.toml", "tasks/__init__.py")) else None


if _source_checkout():
    __path__.append(_source_checkout())
