"""FullKV: keep every token of every block; over budget is an out-of-memory for that problem."""

from __future__ import annotations

from dataclasses import dataclass

from arbor_runtime.policies.base import Capabilities, Policy


@dataclass(slots=True)
class FullPolicy(Policy):
    """Retains everything (the exactness reference). Never frees room."""

    name = "full"
    CAPABILITIES = Capabilities(frees_memory=False)
