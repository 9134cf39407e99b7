"""How a thought ends, through the public Runtime API: EOS (``stop_at_eos``), stop strings that span
token boundaries, and the length limit. The stop points are read off the tiny model's own greedy text,
so the tests do not depend on what a random model happens to write."""

from __future__ import annotations

import pytest

from arbor_runtime import Runtime, SamplingParams

PROMPT = "Input: 4 4 6 8\nSteps:\n"
N = 24

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def greedy(tiny, **params) -> list[int]:
    """The greedy continuation of PROMPT (token ids), under ``params``."""
    rt = Runtime(tiny, seed=0)
    return rt.expand(rt.new_tree(PROMPT), 1, SamplingParams(max_new_tokens=N, temperature=0.0, **params))[0]


def spanning_stop(tokenizer, ids: list[int], pieces: int) -> tuple[str, int]:
    """A stop string made of the last character of one token, ``pieces - 2`` whole tokens and the
    first character of the next, that first appears exactly there; and the index of its last token."""
    texts = ["", *(tokenizer.decode(ids[: i + 1]) for i in range(len(ids)))]  # texts[k]: the first k tokens
    for first in range(len(ids) - pieces + 1):
        last = first + pieces - 1  # the stop string runs from token ``first`` to token ``last``
        if not all(len(texts[k + 1]) > len(texts[k]) for k in range(first, last + 1)):
            continue  # a token that adds no text of its own (part of a multi-byte character)
        start, end = len(texts[first + 1]) - 1, len(texts[last]) + 1
        stop = texts[-1][start:end]
        if texts[-1].find(stop) == start and stop.strip():
            return stop, last
    raise AssertionError("no token boundary to test in the greedy text")


@pytest.mark.parametrize("pieces", [2, 3])
def test_a_stop_string_across_token_boundaries_ends_the_thought_at_its_last_token(tiny, pieces):
    full = greedy(tiny)
    assert full.stop_reason == "length" and full.length == N
    stop, last = spanning_stop(tiny.tokenizer, full.token_ids, pieces)
    kid = greedy(tiny, stop=[stop])
    assert kid.stop_reason == "stop" and kid.token_ids == full.token_ids[: last + 1]
    assert stop in kid.text and stop not in tiny.tokenizer.decode(kid.token_ids[:-1])  # completed by the last token


def test_eos_ends_the_thought_only_with_stop_at_eos(tiny, monkeypatch):
    full = greedy(tiny)
    index = 5
    eos = full.token_ids[index]
    first = full.token_ids.index(eos)  # the thought ends at the first time the model writes it
    monkeypatch.setattr(tiny.model.config, "eos_token_id", eos)  # the runtime reads EOS from the model config
    kid = greedy(tiny)
    assert kid.stop_reason == "eos" and kid.token_ids == full.token_ids[: first + 1]  # EOS kept in the block
    ignored = greedy(tiny, stop_at_eos=False)
    assert ignored.stop_reason == "length" and ignored.token_ids == full.token_ids
