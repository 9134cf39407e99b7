"""Checks on what callers pass the runtime, made before any work starts (nothing changes on a refusal).

Each check raises one clear error naming the bad value and what would be valid: TokenIdError for
token ids, NodeError (through the node table's ``check_live``) for nodes, ValueError for the rest.
Also the model facts the checks rest on (the vocabulary a token id must fall in, the EOS ids).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import replace

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


def seed(value: object, where: str) -> int:
    """A sampling seed: an integer (not a bool); ValueError naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{where}={value!r} must be an integer (it seeds the sampling streams)")
    return int(value)


def text(value: object, where: str) -> str:
    """Text to tokenize: a ``str``; ValueError naming ``where`` otherwise (a tokenizer's own message
    speaks of batches and pairs)."""
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {type(value).__name__} {value!r:.40}")
    return value


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


#: rows one ``expand`` / ``expand_many`` call may ask for in all: every row's state (its sampling
#: stream, its future child) is made when the call starts; ask for more in several calls
MAX_ROWS = 4096


def check_requests(
    requests: Sequence[tuple[Node, int]], check_live: Callable[[Node], None], max_positions: int | None = None
) -> None:
    """``expand_many``'s requests: at least one, each a (live node, positive int) pair, at most
    :data:`MAX_ROWS` rows in all, and each node's path short of the model's last position (a child
    needs one position at least; ``max_positions`` None: the model states no limit)."""
    if not requests:
        raise ValueError("expand_many needs at least one (node, n) request")
    for request in requests:
        if not isinstance(request, tuple | list) or len(request) != 2:
            raise ValueError(f"expand_many: request {request!r:.60} must be a (node, n) pair")
    for node, n in requests:
        check_live(node)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n={n!r} for {node!r} must be a positive integer")
        if n > MAX_ROWS:
            raise ValueError(f"n={n} for {node!r}: at most {MAX_ROWS} children in one call; ask in several calls")
        positions(node.end_pos, 1, max_positions, f"expand {node!r}")
    total = sum(n for _, n in requests)
    if total > MAX_ROWS:
        raise ValueError(f"expand_many asks for {total} children in all: at most {MAX_ROWS} in one call")


def positions(start: int, count: int, max_positions: int | None, where: str) -> None:
    """Refuse (ValueError) ``count`` tokens from position ``start`` that would pass the model's
    ``max_positions`` (its ``config.max_position_embeddings``; None: no limit)."""
    if max_positions is not None and start + count > max_positions:
        raise ValueError(
            f"{where}: {count} token(s) from position {start} pass the model's {max_positions} positions "
            f"(config.max_position_embeddings); valid: at most {max(max_positions - start, 0)} from there"
        )


def max_positions(model: torch.nn.Module) -> int | None:
    """Positions the model was built for (``config.max_position_embeddings``), or None when it says none."""
    value = getattr(model.config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def stop_checkers(
    requests: Sequence[tuple[Node, int]],
    sampling: SamplingParams | Sequence[SamplingParams] | None,
    tokenizer,
    eos_ids: set[int],
    grammar: GrammarCompiler,
    max_positions: int | None = None,
) -> list[StopChecker]:
    """One stop checker per request (shared when the requests share their parameters), each one's
    regex / grammar checked (ValueError) before anything runs.

    A request whose rows could decode past the model's ``max_positions`` gets a checker of its own
    whose ``max_new_tokens`` stops there: its rows end with ``stop_reason="length"``.
    """
    if sampling is None or isinstance(sampling, SamplingParams):
        stop = StopChecker(tokenizer, sampling or SamplingParams(), eos_ids)
        stops = [stop] * len(requests)
    else:
        if isinstance(sampling, str | bytes) or not isinstance(sampling, Sequence):
            raise ValueError(f"sampling={sampling!r:.60} must be a SamplingParams, one per request, or None")
        if len(sampling) != len(requests):
            raise ValueError(f"expand_many: {len(sampling)} SamplingParams for {len(requests)} requests")
        bad = next((p for p in sampling if not isinstance(p, SamplingParams)), None)
        if bad is not None:
            raise ValueError(f"expand_many: {bad!r:.60} is not a SamplingParams")
        made: dict[int, StopChecker] = {}
        stops = [made.setdefault(id(p), StopChecker(tokenizer, p, eos_ids)) for p in sampling]
    for stop in {id(s): s for s in stops}.values():
        grammar.check(stop.params)
    if max_positions is not None:
        stops = [_capped(stop, node.end_pos, max_positions) for stop, (node, _) in zip(stops, requests, strict=True)]
    return stops


def _capped(stop: StopChecker, start: int, max_positions: int) -> StopChecker:
    """``stop``, or a copy whose rows end at the model's last position when they could pass it."""
    room = max_positions - start
    if stop.params.max_new_tokens <= room:
        return stop
    return StopChecker(stop.tokenizer, replace(stop.params, max_new_tokens=room), stop.eos_ids)


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
