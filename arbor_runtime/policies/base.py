"""Memory policy interface.

A policy decides which tokens of which block stay on the device. It sees the tree and the store
through the runtime and answers with a retention plan; it never moves tensors itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arbor_runtime.runtime import Runtime


@dataclass(slots=True)
class Policy:
    """Base policy: holds the budget; subclasses override the hooks they need.

    Attributes:
        budget_tokens: cap on resident device KV tokens (blocks + working buffers); None = no cap.
    """

    name = "base"
    budget_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.budget_tokens is not None and self.budget_tokens <= 0:
            raise ValueError(f"budget_tokens={self.budget_tokens} must be a positive number of tokens or None")

    def make_room(self, runtime: Runtime, needed_tokens: int) -> bool:
        """Called when ``needed_tokens`` more resident tokens would pass the budget.

        Returns True when the policy freed enough room (by a retention plan the store carried
        out), False to let the runtime raise :class:`~arbor_runtime.errors.KVBudgetExceeded`.
        """
        return False
