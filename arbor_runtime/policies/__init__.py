"""Memory policies, one file each, built by name or from Hydra (``_target_``)."""

from __future__ import annotations

from typing import Any

from arbor_runtime.policies.arbor import ArborPolicy
from arbor_runtime.policies.base import MemoryView, Policy, RetentionPlan
from arbor_runtime.policies.full import FullPolicy
from arbor_runtime.policies.h2o import H2OPolicy
from arbor_runtime.policies.kvp import KVPPolicy
from arbor_runtime.policies.snapkv import SnapKVPolicy
from arbor_runtime.policies.streaming import StreamingPolicy
from arbor_runtime.policies.thinkv import ThinKVPolicy

POLICIES: dict[str, type[Policy]] = {
    "full": FullPolicy,
    "h2o": H2OPolicy,
    "streaming": StreamingPolicy,
    "snapkv": SnapKVPolicy,
    "thinkv": ThinKVPolicy,
    "arbor": ArborPolicy,
    "kvp": KVPPolicy,
}


def build_policy(policy: str | Policy, **kwargs: Any) -> Policy:
    """A policy from a name (``"full"``) and its fields, or an already built one (kwargs then unused)."""
    if isinstance(policy, Policy):
        return policy
    try:
        cls = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(sorted(POLICIES))}") from None
    return cls(**kwargs)


__all__ = [
    "POLICIES",
    "ArborPolicy",
    "FullPolicy",
    "H2OPolicy",
    "KVPPolicy",
    "MemoryView",
    "Policy",
    "RetentionPlan",
    "SnapKVPolicy",
    "StreamingPolicy",
    "ThinKVPolicy",
    "build_policy",
]
