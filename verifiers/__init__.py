"""Node scorers: symbolic (Game of 24), LLM value prompts, answer matching."""

from verifiers.base import Scale, Verifier
from verifiers.llm_value import LLMValueVerifier

__all__ = ["LLMValueVerifier", "Scale", "Verifier"]
