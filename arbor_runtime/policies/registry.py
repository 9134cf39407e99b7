"""The memory policies by name: what decides residency (sparse policies wrap one of these)."""

from __future__ import annotations

from arbor_runtime.policies.arbor import ArborPolicy
from arbor_runtime.policies.base import Policy
from arbor_runtime.policies.full import FullPolicy
from arbor_runtime.policies.h2o import H2OPolicy
from arbor_runtime.policies.kvp import KVPPolicy
from arbor_runtime.policies.random import RandomPolicy
from arbor_runtime.policies.snapkv import SnapKVPolicy
from arbor_runtime.policies.streaming import StreamingPolicy
from arbor_runtime.policies.thinkv import ThinKVPolicy

MEMORY_POLICIES: dict[str, type[Policy]] = {
    "full": FullPolicy,
    "h2o": H2OPolicy,
    "streaming": StreamingPolicy,
    "snapkv": SnapKVPolicy,
    "thinkv": ThinKVPolicy,
    "arbor": ArborPolicy,
    "kvp": KVPPolicy,
    "random": RandomPolicy,
}
