"""Node scorers: symbolic (Game of 24), LLM value prompts, answer matching."""

from verifiers.base import Verifier

__all__ = ["Verifier"]
