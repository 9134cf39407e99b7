"""Sliding-window layers: the device KV outside every live node's window is counted (issue 45, item 2),
the count matches a brute force over the tree, and what it calls dead is never read again."""

from __future__ import annotations

import copy

import pytest
import torch
from families import WINDOW, family
from test_branched_exactness import PROMPT

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.kv.windows import reach, window_dead_tokens

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, stop_at_eos=False)


@pytest.fixture(autouse=True)
def _threads(one_torch_thread):
    yield


def grow(rt: Runtime) -> None:
    """A prompt, three children, a long forced block under one, grandchildren under two."""
    root = rt.new_tree(PROMPT)
    a, b, c = rt.expand(root, 3, SamplingParams(max_new_tokens=6, temperature=1.5, seed=3, stop_at_eos=False))
    long = rt.append(a, " 4 + 8 = 12 (left: 4 6 12)\n 12 / 4 = 3 (left: 3 6)\n")
    rt.expand_many([(long, 1), (c, 2)], GREEDY)


def brute_dead(rt: Runtime, window: int) -> set[tuple[int, int]]:
    """(block id, position) of every retained token no live node's next tokens can see in the window."""
    live = list(rt.memory.nodes.values())
    dead = set()
    for block_id in rt.store.block_ids():
        for pos in rt.store.get(block_id).positions.tolist():
            readers = [n for n in live if block_id in {a.id for a in n.kv_path()}]
            if not any(n.end_pos - window < pos for n in readers):
                dead.add((block_id, pos))
    return dead


@pytest.mark.parametrize("window", [WINDOW, 20])
def test_dead_tokens_match_a_brute_force_over_the_tree(window):
    rt = Runtime(family("mistral-window"), policy="full")
    grow(rt)
    readers = [([a.id for a in n.kv_path()], n.end_pos) for n in rt.memory.nodes.values()]
    dead = window_dead_tokens(rt.store, reach(rt.store, readers), window)
    assert dead == len(brute_dead(rt, window)) > 0
    assert dead < rt.store.resident_tokens  # every live node's last tokens stay


@pytest.mark.parametrize(("name", "window_layers"), [("mistral-window", 2), ("gemma2", 1), ("llama", 0)])
def test_metrics_report_what_window_layers_could_free(name, window_layers):
    rt = Runtime(family(name), policy="full")
    grow(rt)
    shape = rt.backend.shape
    per_layer = 2 * shape.kv_heads * shape.head_dim * 4
    want = len(brute_dead(rt, WINDOW)) * per_layer * window_layers
    assert rt.metrics.trace[-1].window_dead_bytes == want
    assert rt.metrics.window_dead_bytes_max >= want and (want > 0) == (window_layers > 0)
    assert rt.metrics.to_dict()["window_dead_bytes_max"] == rt.metrics.window_dead_bytes_max


@pytest.mark.parametrize("name", ["mistral-window", "gemma2"])
def test_what_is_called_dead_is_never_read_again(name):
    """Overwrite the dead tokens' K/V in the window layers with garbage: expanding every live node
    gives bit-identical tokens and log-probs to the untouched runtime."""
    loaded = family(name)
    rt = Runtime(loaded, policy="full")
    grow(rt)
    spoiled = copy.deepcopy(rt, {id(loaded.model): loaded.model, id(loaded.tokenizer): loaded.tokenizer})
    dead = brute_dead(rt, WINDOW)
    pool = spoiled.store.pool
    for block_id, pos in dead:
        blk = spoiled.store.get(block_id)
        slot = blk.slots_of(torch.tensor([pos - blk.start_pos]))
        for layer in rt.backend.attention.windows:
            k, v = pool.gather_layer(layer, slot)
            pool.write_layer(layer, slot, torch.full_like(k, 1e4), torch.full_like(v, -1e4))
    for node_id in sorted(rt.nodes):
        ours = rt.expand(rt.nodes[node_id], 1, GREEDY)[0]
        theirs = spoiled.expand(spoiled.nodes[node_id], 1, GREEDY)[0]
        assert (ours.token_ids, ours.logprobs) == (theirs.token_ids, theirs.logprobs), node_id
    assert len(dead) > 0
