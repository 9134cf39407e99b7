"""ArborKV runtime: tree-structured LLM reasoning with per-thought-block KV cache management."""

from arbor_runtime.errors import ArborError, BudgetError, KVBudgetExceeded, ModelSpecError, NodeError, TokenIdError
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
    "build_policy",
    "load_model",
]
