"""Errors a user can cause or a run can hit; each names the bad value and what is valid."""


class ArborError(Exception):
    """Base class of every error the runtime raises on purpose."""


class ModelSpecError(ArborError, ValueError):
    """A model spec names no loadable model (unknown name, missing file, bad path)."""


class UnsupportedModelError(ModelSpecError):
    """A model whose attention the runtime cannot serve exactly (refused when it loads, never served
    with silently different attention): the message names the model type and what is missing."""


class BudgetError(ArborError, ValueError):
    """A KV budget that can never work (e.g. smaller than the prompt the active path needs)."""


class NodeError(ArborError, ValueError):
    """A node this runtime cannot act on: another runtime's, released, or not a node at all."""


class TokenIdError(ArborError, ValueError):
    """A token id that is not an integer in the model's vocabulary (``0 <= id < vocab_size``)."""


class KVBudgetExceeded(ArborError, MemoryError):
    """Out of KV memory: resident device KV would pass ``budget_tokens``.

    Attributes:
        needed: resident tokens the next step would need.
        budget: the configured budget in tokens.
    """

    def __init__(self, needed: int, budget: int, where: str = "") -> None:
        self.needed, self.budget = needed, budget
        at = f" during {where}" if where else ""
        super().__init__(f"KV budget exceeded{at}: needs {needed} resident tokens, budget_tokens={budget}")
