"""Node scorers: symbolic (Game of 24), LLM value prompts, answer matching."""

from arbor_runtime.verifiers.base import Scale, Verifier
from arbor_runtime.verifiers.llm_value import LLMValueVerifier

__all__ = ["LLMValueVerifier", "Scale", "Verifier"]
