"""Memory policies, one file each, built by name or from Hydra (``_target_``)."""

from __future__ import annotations

from typing import Any

from arbor_runtime.policies.base import Policy
from arbor_runtime.policies.full import FullPolicy

POLICIES: dict[str, type[Policy]] = {"full": FullPolicy}


def build_policy(policy: str | Policy, **kwargs: Any) -> Policy:
    """A policy from a name (``"full"``) and its fields, or an already built one (kwargs then unused)."""
    if isinstance(policy, Policy):
        return policy
    try:
        cls = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(sorted(POLICIES))}") from None
    return cls(**kwargs)


__all__ = ["POLICIES", "FullPolicy", "Policy", "build_policy"]
