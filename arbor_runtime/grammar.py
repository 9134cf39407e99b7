"""Grammar-constrained sampling: one llguidance matcher per row, a token mask per decode step.

Library: llguidance (guidance-ai; one of the structured-output backends of vLLM and SGLang). Chosen
over xgrammar and outlines-core because it has no Python dependencies (xgrammar pulls triton on
Linux x86-64), one abi3 wheel for every CPython >= 3.10, takes both regexes and context-free Lark
grammars (outlines-core: regexes and JSON schemas only), and computes each mask lazily from the
parser state (nothing built over the whole vocabulary up front): about 50 us per row and step on
this CPU after the first tokens (``scripts/bench_grammar.py``).

The engine gives a row a :class:`Matcher` when its ``SamplingParams`` carry a ``regex`` or a
``grammar``; before each draw the row's logits outside the mask become -inf (the draw then comes
from the model's distribution renormalized over the allowed tokens, after temperature, before
top-k / top-p), the sampled token advances the matcher, and ``Row.restart`` resets it. Log-probs
recorded in the tree stay those of the raw model distribution. Unconstrained rows never touch this
module.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from arbor_runtime.grammar_source import grammar_text, llguidance_module, one_line
from arbor_runtime.sampling import SamplingParams

_BITS = torch.arange(32, dtype=torch.int32)


class GrammarCompiler:
    """Matchers for one tokenizer: its llguidance view is built once (about 0.5 s), on first use.

    Args:
        tokenizer: a fast Hugging Face tokenizer.
        vocab_size: the model's vocabulary (the logits' width; may exceed the tokenizer's).
    """

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, int(vocab_size)
        self._ll_tokenizer = None
        self._templates: dict[tuple[str, str], Any] = {}  # compiled once, copied per row
        self._lock = threading.Lock()

    def check(self, params: SamplingParams) -> None:
        """ValueError (one line naming the regex or grammar) when it does not compile."""
        if params.constrained:
            self.matcher(params)

    def matcher(self, params: SamplingParams) -> Matcher:
        """A fresh matcher at the start of ``params``' regex or grammar."""
        key = ("regex", params.regex) if params.regex is not None else ("grammar", params.grammar)
        template = self._templates.get(key)
        if template is None:
            template = self._compile(*key)
            self._templates[key] = template
        return Matcher(template.deep_copy(), self.vocab_size)

    def _compile(self, kind: str, source: str) -> Any:
        inner = llguidance_module().LLMatcher(self._tokenizer(), grammar_text(kind, source), log_level=0)
        if inner.is_error():
            raise ValueError(f"SamplingParams {kind}={source!r} does not compile: {one_line(inner.get_error())}")
        return inner

    def _tokenizer(self):
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
            return self._ll_tokenizer


class Matcher:
    """One row's position in its grammar."""

    def __init__(self, inner: Any, vocab_size: int) -> None:
        self.inner, self.vocab_size = inner, vocab_size
        self._words = torch.zeros(1, (vocab_size + 31) // 32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """(V,) bool: the tokens the grammar admits next (EOS only once it is complete)."""
        words = self._words[0]
        self.inner.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        bits = (words.unsqueeze(1) >> _BITS) & 1  # (V / 32, 32): bit j of word i = token 32 i + j
        return bits.reshape(-1)[: self.vocab_size].bool()

    def advance(self, token: int) -> None:
        """Consume a sampled token (it was allowed); RuntimeError if the grammar rejects it."""
        if not self.inner.consume_token(int(token)):
            raise RuntimeError(f"grammar rejected token {token}: {self.inner.get_error()}")

    @property
    def stopped(self) -> bool:
        """The grammar admits no further token (only EOS): the row's thought is complete."""
        return bool(self.inner.is_stopped())

    def reset(self) -> None:
        """Back to the start of the grammar (a preempted row restarts)."""
        self.inner.reset()


def mask_logits(logits: torch.Tensor, matchers: list[Matcher | None]) -> torch.Tensor:
    """(B, V) logits with each constrained row's disallowed tokens at -inf (a copy; None rows unchanged)."""
    out = logits.clone()
    for i, matcher in enumerate(matchers):
        if matcher is not None:
            allowed = matcher.allowed().to(out.device)
            out[i, : allowed.numel()].masked_fill_(~allowed, float("-inf"))
            out[i, allowed.numel() :] = float("-inf")
    return out
