"""Sampling parameters and the per-step token sampler."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from arbor_runtime.grammar_source import check_source


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one thought is generated (vLLM-style names); immutable, checked once when built.

    Attributes:
        max_new_tokens: tokens a thought may take at most (> 0). A row also ends ("length") where
            the model's positions end (``config.max_position_embeddings``): a thought never decodes
            past them, whatever this says.
        temperature: 0 means greedy; otherwise logits are divided by it.
        top_p: nucleus mass in (0, 1]; 1 keeps the whole distribution.
        top_k: keep the k most likely tokens; 0 disables.
        stop: strings that end a thought (a string, or a sequence of strings; stored as a tuple,
            empty strings left out); the token completing a stop string is kept in the block.
        seed: seeds this call's generator; None uses the runtime's own generator.
        stop_at_eos: end a thought at the tokenizer's EOS token (kept in the block).
        regex: constrain every sampled thought to match this regular expression (llguidance
            syntax, anchored at both ends); None samples freely.
        grammar: constrain every sampled thought to this Lark grammar (llguidance's dialect, start
            rule ``start``); None samples freely. At most one of ``regex`` and ``grammar``.

    A constrained row ends when its grammar admits no further token ("grammar"), or earlier at a
    stop string, EOS or ``max_new_tokens`` (then its text is a prefix of a match).

    Frozen: a value is checked here once and cannot change afterwards (``p.temperature = nan``
    raises ``FrozenInstanceError``); ``dataclasses.replace(p, temperature=0.0)`` makes a checked copy.
    """

    max_new_tokens: int = 48
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stop_at_eos: bool = True
    regex: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be an integer >= 1")
        # `not (x >= 0)` and `not (0 < x <= 1)` also refuse nan, which every comparison fails
        if not _is_real(self.temperature) or not (0 <= self.temperature < math.inf):
            raise ValueError(f"temperature={self.temperature!r} must be a finite number >= 0 (0 is greedy)")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p!r} must be a number in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0 disables)")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed={self.seed!r} must be an integer or None")
        if not isinstance(self.stop_at_eos, bool):
            raise ValueError(f"stop_at_eos={self.stop_at_eos!r} must be True or False")
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        if self.regex is not None and self.grammar is not None:
            raise ValueError("SamplingParams: give regex= or grammar=, not both")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"SamplingParams: {name}={value!r} must be a non-empty string or None")
            if value is not None:
                check_source(name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def constrained(self) -> bool:
        """Whether thoughts are sampled under a regex or grammar."""
        return self.regex is not None or self.grammar is not None


def _stop_strings(stop) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings: one string, or a sequence of strings."""
    if isinstance(stop, str):
        return (stop,) if stop else ()
    valid = "valid: a string or a sequence of strings (stop=() for none)"
    if not isinstance(stop, Sequence) or isinstance(stop, bytes):
        raise ValueError(f"stop={stop!r:.60} must be a string or a sequence of strings; {valid}")
    bad = next((s for s in stop if not isinstance(s, str)), None)
    if bad is not None:
        raise ValueError(f"stop={stop!r:.60}: {bad!r} is not a string; {valid}")
    return tuple(s for s in stop if s)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | Sequence[torch.Generator]
) -> torch.Tensor:
    """Draw one token per row.

    Args:
        logits: (B, V) float logits of the next token.
        generator: one generator for all rows, or one per row (then a row's draw depends only on
            its own stream, never on which rows share the batch).
    Returns:
        (B,) long token ids.
    """
    if params.greedy:
        return greedy_tokens(logits)
    probs = tempered_probs(logits, params)
    # Inverse-CDF draw: one uniform per row (torch.multinomial is ~100x slower on a 49k vocab on CPU).
    cdf = probs.cumsum(dim=-1)
    u = _uniforms(probs.shape[0], generator) * cdf[:, -1:]
    picks = torch.searchsorted(cdf, u, side="right").clamp_(max=probs.shape[-1] - 1)
    return picks.squeeze(-1).to(logits.device)


def greedy_tokens(scores: torch.Tensor) -> torch.Tensor:
    """(B, V) scores -> (B,) long: each row's first maximal index, what ``argmax`` gives.

    On CPU by numpy's ``argmax`` (vectorized; torch's takes about ten times as long on one thread: 4.7 vs
    0.43 ms at 64 rows of a 49,152-token vocabulary); half-precision scores are widened first, which keeps
    their order."""
    if scores.device.type != "cpu":
        return scores.argmax(dim=-1)
    wide = scores.detach().float() if scores.dtype in (torch.bfloat16, torch.float16) else scores.detach()
    return torch.from_numpy(np.argmax(wide.contiguous().numpy(), axis=-1)).long()


def draw_rows(
    logits: torch.Tensor, scores: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step's draw and statistics: each row's token from ``scores`` (:func:`sample_tokens`, its
    own generator) and its log-prob and entropy under ``logits`` (:func:`token_stats`).

    On CPU each row is drawn alone: its token and statistics are then bit-identical whatever rows share
    its batch (a reduction over a (B, V) tensor may round differently from one over (1, V)), and the passes
    over the vocabulary work on temporaries that stay in the CPU's cache (the whole batch's, 12.6 MB at 64
    rows of a 49,152-token vocabulary, took about twice as long: ``python -m benchmarks.step_overhead``).
    Other devices take the whole batch in one pass (one kernel each).

    Args:
        logits: (B, V) raw logits; scores: (B, V) what the draw reads (``logits`` masked by a grammar, or
            ``logits`` itself); generators: B generators, one a row.
    Returns:
        tokens (B,) long, logprobs (B,) and entropies (B,) float32.
    """
    step = 1 if logits.device.type == "cpu" else max(1, logits.shape[0])
    parts = []
    for start in range(0, logits.shape[0], step):
        rows = slice(start, start + step)
        tokens = sample_tokens(scores[rows], params, generators[rows])
        parts.append((tokens, *token_stats(logits[rows], tokens)))
    if len(parts) == 1:
        return parts[0]
    tokens, logprobs, entropies = zip(*parts, strict=True)
    return torch.cat(tokens), torch.cat(logprobs), torch.cat(entropies)


def tempered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(B, V) float64 probabilities a sampled step draws from: ``logits`` / temperature, top-k and top-p
    applied (what :func:`sample_tokens` builds its CDF from)."""
    scores = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scores, min(params.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        scores = _top_p_filter(scores, params.top_p)
    return torch.softmax(scores, dim=-1).cpu().double()


def draw_gap(logits: torch.Tensor, params: SamplingParams, u: float, token: int) -> float:
    """How far the uniform ``u`` lies from ``token``'s interval of the inverse-CDF draw from ``logits``.

    A sampled step draws ``token`` when ``cdf[token - 1] <= u < cdf[token]`` (the CDF of
    :func:`tempered_probs`, normalized). 0 when drawing from ``logits`` with ``u`` gives ``token``;
    otherwise the distance in probability from ``u`` to the nearer end of ``token``'s interval. Two
    computations of the same logits that differ only by float rounding (other kernels, another
    summation order) draw the same token except where ``u`` lies within :func:`near_tie_band` of a CDF
    boundary: there the gap is at most that band.

    Args:
        logits: (V,) or (1, V) logits of one step.
    """
    probs = tempered_probs(logits.reshape(1, -1), params)[0]
    cdf = probs.cumsum(-1)
    u = u * float(cdf[-1])
    low = float(cdf[token - 1]) if token > 0 else 0.0
    high = float(cdf[token])
    return 0.0 if low <= u < high else (low - u if u < low else u - high)


def near_tie_band(logprob_tol: float, temperature: float) -> float:
    """The CDF gap two draws may show when their raw log-probs differ by at most ``logprob_tol``.

    Each tempered log-probability then differs by at most ``2 * logprob_tol / temperature`` (a
    logit's rounding and the normalizer's), each probability by that factor, and each CDF value
    by at most ``expm1(2 * logprob_tol / temperature)``: a uniform draw closer than that to a CDF
    boundary may fall on either side of it on two correct sets of kernels.
    """
    return math.expm1(2.0 * logprob_tol / temperature)


def _uniforms(rows: int, generator) -> torch.Tensor:
    """(rows, 1) float64 uniforms, from one generator or one per row."""
    if isinstance(generator, torch.Generator):
        return torch.rand(rows, 1, generator=generator, dtype=torch.float64)
    return torch.cat([torch.rand(1, 1, generator=g, dtype=torch.float64) for g in generator])


def row_seed(base: int, node_key: int, index: int) -> int:
    """Seed of one row's sampling stream: the call's (or tree's) seed, the expanded node's content
    key and the child's index under it. Never a node id or a batch position: a row samples the same
    tokens however it is batched, split, preempted, or interleaved with other trees."""
    mixed = (base * 0x9E3779B97F4A7C15 + node_key * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB + 1) % (1 << 64)
    mixed ^= mixed >> 31
    return mixed % (1 << 63)


def token_stats(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of the chosen tokens and entropy, under the raw model distribution.

    Args:
        logits: (B, V) logits; tokens: (B,) chosen ids.
    Returns:
        logprobs (B,), entropy (B,), both float32 (nats).
    """
    x = logits.float()
    z = x - x.amax(dim=-1, keepdim=True)
    e = z.exp()  # the one pass of exp over the vocabulary (log_softmax, then exp of it, made two)
    total = e.sum(dim=-1, keepdim=True)
    log_total = total.log()
    chosen = (z.gather(-1, tokens.view(-1, 1)) - log_total).squeeze(-1)  # log_softmax at the token
    entropy = (log_total - (e * z).sum(dim=-1, keepdim=True) / total).squeeze(-1)  # log Z - E[z]
    return chosen, entropy


def _top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask tokens outside the smallest set whose probability mass reaches ``top_p``. (B, V)."""
    sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
    cum = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    drop_sorted = cum - torch.softmax(sorted_scores, dim=-1) >= top_p  # always keeps the top token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))
