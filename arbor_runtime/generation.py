"""Batched sampling loop: every row decodes from its own context until it stops.

One step reads ``schedule -> run -> postprocess``: feed each row's last sampled token, run the
model once for the whole batch, then sample the next token (or, for a row that just stopped,
keep the logits that follow its final token). A row's final token is fed too, so a finished
block's KV is complete and the distribution after it is kept for its future children.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from arbor_runtime.attention import AttentionRecorder
from arbor_runtime.backend import BatchCache, ModelBackend
from arbor_runtime.sampling import SamplingParams, sample_tokens, token_stats


@dataclass(slots=True)
class Row:
    """One sequence being generated.

    Attributes:
        start_pos: position id of the row's first new token (its context's path length).
        tokens / logprobs / entropies: what was sampled so far.
        fed: tokens whose KV the model has computed (<= len(tokens)).
        stop_reason: set once the row has sampled its last token.
        next_logits: (V,) logits after the final token, set when the row is done.
    """

    start_pos: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    fed: int = 0
    stop_reason: str = ""
    next_logits: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self.next_logits is not None


class StopChecker:
    """Decides when a row's thought ends: stop string, EOS, or length."""

    def __init__(self, tokenizer: object, params: SamplingParams, eos_ids: set[int]) -> None:
        self.tokenizer, self.params, self.eos_ids = tokenizer, params, eos_ids
        self._tail = max((len(s) for s in params.stop), default=0)

    def reason(self, row: Row) -> str:
        """ "" while the row goes on, else "eos" | "stop" | "length"."""
        if self.params.stop_at_eos and row.tokens[-1] in self.eos_ids:
            return "eos"
        if self.params.stop and self._has_stop(row.tokens):
            return "stop"
        if len(row.tokens) >= self.params.max_new_tokens:
            return "length"
        return ""

    def _has_stop(self, tokens: list[int]) -> bool:
        # Only a stop string that ends in the newest token can be new; decode a short tail.
        tail = self.tokenizer.decode(tokens[-(self._tail + 2) :])
        return any(s in tail for s in self.params.stop)


def sample_into(rows: Sequence[Row], logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> None:
    """Sample one token for each row from (B, V) logits and record its stats."""
    tokens = sample_tokens(logits, params, gen)
    logprobs, entropies = token_stats(logits, tokens)
    for row, tok, lp, ent in zip(rows, tokens.tolist(), logprobs.tolist(), entropies.tolist(), strict=True):
        row.tokens.append(tok)
        row.logprobs.append(lp)
        row.entropies.append(ent)


def decode_rows(
    backend: ModelBackend,
    cache: BatchCache,
    rows: list[Row],
    params: SamplingParams,
    stop: StopChecker,
    gen: torch.Generator,
    before_step: Callable[[int, int], None],
    recorder: AttentionRecorder | None = None,
) -> None:
    """Run the loop until every row is done. Rows arrive with their first token sampled.

    ``before_step(working_tokens, live_rows)`` is called before each forward with the KV tokens
    the batch will hold after it and the rows still decoding (the runtime checks the budget there).
    With a ``recorder``, only live rows' queries count (finished rows feed padding that must not
    add attention mass).
    """
    for row in rows:
        row.stop_reason = stop.reason(row)
    pad = rows[0].tokens[0]
    while not all(r.done for r in rows):
        live = [not r.done for r in rows]
        before_step(sum(r.fed + int(alive) for r, alive in zip(rows, live, strict=True)), sum(live))
        ids = torch.tensor([[r.tokens[-1] if alive else pad] for r, alive in zip(rows, live, strict=True)])
        pos = torch.tensor([[r.start_pos + (r.fed if alive else 0)] for r, alive in zip(rows, live, strict=True)])
        if recorder is not None:
            recorder.row_weight = torch.tensor(live, dtype=torch.float32, device=recorder.mass.device)
        logits = backend.forward(cache, ids, pos, recorder=recorder)[:, -1]  # (B, V)
        _postprocess(rows, live, logits, params, stop, gen)


def _postprocess(
    rows: list[Row], live: list[bool], logits: torch.Tensor, params: SamplingParams, stop: StopChecker, gen
) -> None:
    going = []
    for i, (row, alive) in enumerate(zip(rows, live, strict=True)):
        if not alive:
            continue
        row.fed += 1
        if row.stop_reason:
            row.next_logits = logits[i].float().cpu().clone()
        else:
            going.append(i)
    if going:
        sub = [rows[i] for i in going]
        sample_into(sub, logits[going], params, gen)
        for row in sub:
            row.stop_reason = stop.reason(row)
