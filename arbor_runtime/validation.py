"""Checks on what callers pass the runtime, made before any work starts (nothing changes on a refusal).

Each check raises one clear error naming the bad value and what would be valid: TokenIdError for
token ids, NodeError (through the node table's ``check_live``) for nodes, ValueError for the rest.
Also the model facts the checks rest on (the vocabulary a token id must fall in, the EOS ids).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import torch

from arbor_runtime.errors import TokenIdError
from arbor_runtime.generation import StopChecker
from arbor_runtime.grammar import GrammarCompiler
from arbor_runtime.loading import LoadedModel
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import Node


def token_ids(ids: Sequence[int], where: str, vocab_size: int) -> list[int]:
    """``ids`` as ints, each in ``0 <= id < vocab_size``; TokenIdError naming the first bad one (at ``where``)."""
    if isinstance(ids, str | bytes):
        raise TokenIdError(f"{where}: token ids must be a sequence of integers, got the string {ids!r:.40}")
    if hasattr(ids, "tolist"):  # a tensor or an array: one conversion, not one per element
        ids = ids.tolist()
    try:
        items = list(ids)
    except TypeError:
        raise TokenIdError(f"{where}: token ids must be a sequence of integers, got {ids!r:.40}") from None
    out = []
    for i, tok in enumerate(items):
        try:
            value = operator.index(tok)
        except TypeError:
            raise TokenIdError(f"{where}: token id {tok!r} at index {i} is not an integer") from None
        if not 0 <= value < vocab_size:
            raise TokenIdError(
                f"{where}: token id {value} at index {i} is outside the vocabulary: "
                f"valid ids are 0..{vocab_size - 1} (vocab_size={vocab_size})"
            )
        out.append(value)
    return out


def token_span(span: Sequence[int] | None, length: int, where: str) -> tuple[int, int] | None:
    """``span`` as a (start, end) pair with ``0 <= start <= end <= length``, or None; ValueError naming it."""
    if span is None:
        return None
    try:
        start, end = (operator.index(v) for v in span)
    except (TypeError, ValueError):
        raise ValueError(f"{where}={span!r} must be a (start, end) pair of integers, or None") from None
    if not 0 <= start <= end <= length:
        raise ValueError(f"{where}={span!r} must satisfy 0 <= start <= end <= {length}")
    return start, end


def examples_tokens(tokenizer, prompt: str, ids: Sequence[int], span: Sequence[int] | None) -> tuple[int, int] | None:
    """The token span of ``prompt``'s few-shot examples given as a character ``span`` [start, end).

    Each end is where the tokens of ``prompt[:offset]`` stop agreeing with the prompt's own ``ids``
    (a token that straddles the offset counts as outside the examples: it stays). None: None.
    """
    start, end = token_span(span, len(prompt), "examples") or (None, None)
    if start is None:
        return None

    def agree(offset: int) -> int:
        head = tokenizer(prompt[:offset], add_special_tokens=True)["input_ids"]
        n = 0
        while n < min(len(head), len(ids)) and head[n] == ids[n]:
            n += 1
        return n

    first = agree(start)
    return first, max(first, agree(end) - 1)


def check_requests(requests: Sequence[tuple[Node, int]], check_live: Callable[[Node], None]) -> None:
    """``expand_many``'s requests: at least one, each a (live node, positive int) pair."""
    if not requests:
        raise ValueError("expand_many needs at least one (node, n) request")
    for request in requests:
        if not isinstance(request, tuple | list) or len(request) != 2:
            raise ValueError(f"expand_many: request {request!r:.60} must be a (node, n) pair")
    for node, n in requests:
        check_live(node)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n={n!r} for {node!r} must be a positive integer")


def stop_checkers(
    requests: Sequence[object],
    sampling: SamplingParams | Sequence[SamplingParams] | None,
    tokenizer,
    eos_ids: set[int],
    grammar: GrammarCompiler,
) -> list[StopChecker]:
    """One stop checker per request (shared when the requests share their parameters), each one's
    regex / grammar checked (ValueError) before anything runs."""
    if sampling is None or isinstance(sampling, SamplingParams):
        stop = StopChecker(tokenizer, sampling or SamplingParams(), eos_ids)
        stops = [stop] * len(requests)
    else:
        if len(sampling) != len(requests):
            raise ValueError(f"expand_many: {len(sampling)} SamplingParams for {len(requests)} requests")
        made: dict[int, StopChecker] = {}
        stops = [made.setdefault(id(p), StopChecker(tokenizer, p, eos_ids)) for p in sampling]
    for stop in {id(s): s for s in stops}.values():
        grammar.check(stop.params)
    return stops


def finite_value(value: float, node: Node) -> float:
    """``value`` as a float, refused (ValueError) unless a finite number: policies rank blocks by it."""
    bad = isinstance(value, str | bytes) or value is None
    try:
        number = float(value) if not bad else math.nan
    except (TypeError, ValueError):
        number, bad = math.nan, True
    if bad or not math.isfinite(number):
        raise ValueError(f"set_value: value={value!r} for {node!r} must be a finite number")
    return number


def vocab_size(model: torch.nn.Module) -> int:
    """Token ids the model can take and score: its config's vocabulary, or fewer embedding rows."""
    size = int(model.config.vocab_size)
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embed, "num_embeddings", None)
    return min(size, int(rows)) if rows is not None else size


def eos_ids(loaded: LoadedModel) -> set[int]:
    """The token ids that end a generated block: the tokenizer's EOS and the model config's (one or a list)."""
    ids = set()
    tok_eos = getattr(loaded.tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    cfg_eos = getattr(loaded.model.config, "eos_token_id", None)
    if isinstance(cfg_eos, int):
        ids.add(cfg_eos)
    elif isinstance(cfg_eos, list):
        ids.update(int(i) for i in cfg_eos)
    return ids
