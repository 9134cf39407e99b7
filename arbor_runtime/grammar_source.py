"""Regexes and grammars as llguidance reads them, checked without a tokenizer.

A leaf below both :mod:`arbor_runtime.sampling` (``SamplingParams`` checks its regex or grammar when
built) and :mod:`arbor_runtime.grammar` (the per-row matchers).
"""

from __future__ import annotations

from typing import Any


def check_source(kind: str, source: str) -> None:
    """ValueError, one line, when a regex (``kind="regex"``) or Lark grammar (``"grammar"``) does not compile."""
    error = llguidance_module().LLMatcher.validate_grammar(grammar_text(kind, source))
    if error:
        raise ValueError(f"SamplingParams {kind}={source!r} does not compile: {one_line(error)}")


def grammar_text(kind: str, source: str) -> str:
    """llguidance's grammar text for a regex or a Lark grammar."""
    matcher = llguidance_module().LLMatcher
    return (matcher.grammar_from_regex if kind == "regex" else matcher.grammar_from_lark)(source)


def one_line(error: str) -> str:
    """llguidance's error report (the message, a picture of the source, ``error:`` lines) as one line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return " ".join([lines[0], *(line for line in lines[1:] if line.startswith("error:"))]) if lines else error


def llguidance_module() -> Any:
    """The ``llguidance`` module (a dependency of the package)."""
    try:
        import llguidance
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ValueError("grammar-constrained sampling needs llguidance: pip install llguidance") from exc
    return llguidance
