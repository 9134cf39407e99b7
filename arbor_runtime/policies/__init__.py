"""Memory policies, one file each, built by name or from Hydra (``_target_``).

``lychee`` and ``quest`` are sparse attention policies: they wrap a memory policy (``memory=``)
and decide what decode steps read of what it keeps resident (see ``sparse.py``); ``oracle_topk``
reads the exact top-k keys at the same read budget, a bound to measure them against.
"""

from __future__ import annotations

from typing import Any

from arbor_runtime.policies.arbor import ArborPolicy
from arbor_runtime.policies.base import Capabilities, MemoryView, Policy, RetentionPlan
from arbor_runtime.policies.full import FullPolicy
from arbor_runtime.policies.h2o import H2OPolicy
from arbor_runtime.policies.kvp import KVPPolicy
from arbor_runtime.policies.lychee import LycheePolicy
from arbor_runtime.policies.oracle_topk import OracleTopKPolicy
from arbor_runtime.policies.quest import QuestPolicy
from arbor_runtime.policies.random import RandomPolicy
from arbor_runtime.policies.registry import MEMORY_POLICIES
from arbor_runtime.policies.snapkv import SnapKVPolicy
from arbor_runtime.policies.sparse import SparsePolicy
from arbor_runtime.policies.streaming import StreamingPolicy
from arbor_runtime.policies.thinkv import ThinKVPolicy

#: the sparse decode policies by name (each wraps a memory policy)
SPARSE_POLICIES: dict[str, type[SparsePolicy]] = {
    "lychee": LycheePolicy,
    "quest": QuestPolicy,
    "oracle_topk": OracleTopKPolicy,
}
POLICIES: dict[str, type[Policy]] = {**MEMORY_POLICIES, **SPARSE_POLICIES}


def build_policy(policy: str | Policy, **kwargs: Any) -> Policy:
    """A policy from a name (``"full"``) and its fields, or an already built one. A field given beside a
    built policy must be what the policy already says (``None`` means "not given"): ValueError otherwise,
    never a value silently dropped (``Runtime(lm, policy=ArborPolicy(), budget_tokens=500)``)."""
    if isinstance(policy, Policy):
        for key, value in kwargs.items():
            held = getattr(policy, key, None)
            if value is not None and value != held:
                name = type(policy).__name__
                raise ValueError(
                    f"{key}={value!r} conflicts with the built {name}'s {key}={held!r}: set it on the policy "
                    f"({name}({key}={value!r})) or pass the policy by name (policy={policy.name!r}, {key}={value!r})"
                )
        return policy
    try:
        cls = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(sorted(POLICIES))}") from None
    return cls(**kwargs)


__all__ = [
    "MEMORY_POLICIES",
    "POLICIES",
    "SPARSE_POLICIES",
    "ArborPolicy",
    "Capabilities",
    "FullPolicy",
    "H2OPolicy",
    "KVPPolicy",
    "LycheePolicy",
    "MemoryView",
    "OracleTopKPolicy",
    "Policy",
    "QuestPolicy",
    "RandomPolicy",
    "RetentionPlan",
    "SnapKVPolicy",
    "SparsePolicy",
    "StreamingPolicy",
    "ThinKVPolicy",
    "build_policy",
]
