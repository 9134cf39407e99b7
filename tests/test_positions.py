"""DESIGN.md invariant 2 under eviction: a retained token keeps its position, a new token gets the true
path length, whatever was evicted (issue 24, item 3).

Each test records every model forward the runtime makes (the retained tokens of the path's blocks at
that moment, read from the store, and the token ids it feeds) and replays it with plain
``transformers``: a cache holding exactly the retained tokens' K/V (as the reference itself computed
them, RoPE applied at their original positions) and the new tokens at positions the test counts
itself from the tree (tokens on the path before them). The runtime's log-probabilities must equal
the replay's to float tolerance. A runtime that took positions from the physical cache length (the
retained tokens, not the path) rotates its queries and new keys differently and fails by far more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from floats import reassociation_tol
from transformers import DynamicCache

from arbor_runtime import Node, Runtime, SamplingParams

pytestmark = pytest.mark.exactness  # CI runs these again under another ATEN_CPU_CAPABILITY

EVICTING = ["h2o", "streaming", "snapkv", "thinkv", "kvp", "arbor"]
SHRINKING = [p for p in EVICTING if p != "arbor"]  # may evict from the active path (arbor keeps it whole)
LONG_PROMPT = "Use numbers and basic arithmetic operations (+ - * /) to obtain 24. " * 6 + "\nInput: 4 4 6 8\nSteps:\n"
FORCED = " 4 + 4 = 8 (left: 6 8 8)\n"
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, stop_at_eos=False)

Key = tuple[int, int]  # (block id, block-local token index): one token of one block


@pytest.fixture(autouse=True)
def _threads(one_torch_thread):
    yield


@dataclass
class Forward:
    """One model forward of the runtime: what each path block kept then (block-local indices) and the fed ids."""

    kept: dict[int, torch.Tensor]
    ids: torch.Tensor  # (R, q)
    logits: torch.Tensor  # (R, q', V) what the runtime computed (q' = q or 1)


@dataclass
class Recorder:
    """Every backend forward, with a snapshot of the store's retained indices taken just before it."""

    rt: Runtime
    forwards: list[Forward] = field(default_factory=list)

    def __post_init__(self) -> None:
        forward, store = self.rt.backend.forward, self.rt.store

        def recorded(batch, input_ids, position_ids, *args, **kwargs):
            kept = {i: store.get(i).kept.clone() for i in store.block_ids()}
            out = forward(batch, input_ids, position_ids, *args, **kwargs)
            self.forwards.append(Forward(kept, input_ids.clone(), out.detach().clone()))
            return out

        self.rt.backend.forward = recorded

    def take(self) -> list[Forward]:
        out, self.forwards = self.forwards, []
        return out


def path_offset(node: Node) -> int:
    """Tokens on the path before ``node``'s block: its first token's true position."""
    return sum(len(a.token_ids) for a in node.path()[:-1])


class Reference:
    """Plain ``transformers`` forwards over exactly the retained tokens, with true position ids.

    ``kv[(block, i)]`` holds the per-layer (K, V) of one token as the reference computed it, each
    (L, H_kv, D); K carries RoPE at the position it was computed at.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.kv: dict[Key, tuple[torch.Tensor, torch.Tensor]] = {}
        #: per forward: path tokens before the new ones that were not retained (true position - context)
        self.evicted: list[int] = []

    @torch.no_grad()
    def forward(
        self, context: list[tuple[Key, int]], new: list[Key], ids: list[int], positions: list[int]
    ) -> torch.Tensor:
        """Feed ``ids`` at ``positions`` over the cached ``context`` ((key, true position) pairs).

        Returns (q, V) float32 log-probs; stores the new tokens' K/V under ``new``.
        """
        context = sorted(context, key=lambda kp: kp[1])
        self.evicted.append(positions[0] - len(context))
        cache = None
        if context:
            ks = torch.stack([self.kv[k][0] for k, _ in context], dim=2)  # (L, H_kv, C, D)
            vs = torch.stack([self.kv[k][1] for k, _ in context], dim=2)
            cache = self.cache([(ks[i].unsqueeze(0), vs[i].unsqueeze(0)) for i in range(ks.shape[0])])
        out = self.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.tensor([positions]),
            attention_mask=self.mask([p for _, p in context], positions),
            cache=cache if cache is not None else self.cache(None),
            use_cache=True,
        )
        layers = out.cache.layers
        for j, key in enumerate(new):
            at = len(context) + j
            self.kv[key] = (
                torch.stack([lay.keys[0, :, at] for lay in layers]),
                torch.stack([lay.values[0, :, at] for lay in layers]),
            )
        return torch.log_softmax(out.logits[0].float(), dim=-1)

    def mask(self, context_positions: list[int], positions: list[int]):
        """The replayed forward's attention mask: every cached key and the new tokens causally (2-D
        ones; tests/test_families.py replaces it with masks on original positions for sliding windows)."""
        return torch.ones(1, len(context_positions) + len(positions), dtype=torch.long)

    def cache(self, data: list[tuple[torch.Tensor, torch.Tensor]] | None) -> DynamicCache:
        """The replay's cache holding ``data`` (per layer (K, V), each (1, H_kv, C, D)); None = empty."""
        if data is None:
            return DynamicCache(config=self.model.config)
        return DynamicCache(ddp_cache_data=data, config=self.model.config)

    def context(self, fwd: Forward, blocks: list[Node], own: Node | None = None, before: int = 0):
        """(key, true position) of every token ``blocks`` retained at ``fwd`` (and ``own``'s first
        ``before`` tokens, retained or in a row's buffer)."""
        out = []
        for node in blocks:
            start, kept = path_offset(node), fwd.kept.get(node.id, torch.zeros(0, dtype=torch.long))
            out += [((node.id, int(i)), start + int(i)) for i in kept]
        if own is not None:
            kept = fwd.kept.get(own.id)
            local = range(before) if kept is None else [int(i) for i in kept if i < before]
            out += [((own.id, i), path_offset(own) + i) for i in local]
        return out

    def prefill(self, node: Node, forwards: list[Forward]) -> torch.Tensor:
        """Replay a new_tree / append of ``node`` (one forward per chunk); (T, V) log-probs, row i after token i."""
        start, done, rows = path_offset(node), 0, []
        for fwd in forwards:
            q = fwd.ids.shape[1]
            assert fwd.ids[0].tolist() == node.token_ids[done : done + q]
            ctx = self.context(fwd, node.path()[:-1], own=node, before=done)
            new = [(node.id, done + j) for j in range(q)]
            positions = list(range(start + done, start + done + q))
            rows.append(self.forward(ctx, new, node.token_ids[done : done + q], positions))
            done += q
        assert done == node.length, "one forward per chunk, and nothing else (no recompute)"
        return torch.cat(rows)

    def decode(self, child: Node, forwards: list[Forward]) -> torch.Tensor:
        """Replay the decode of one row that became ``child``; (T, V) log-probs, row j after token j."""
        start, rows = path_offset(child), []
        assert len(forwards) == child.length, "one decode forward per token of the only row"
        for j, fwd in enumerate(forwards):
            assert fwd.ids.tolist() == [[child.token_ids[j]]]
            ctx = self.context(fwd, child.path()[:-1], own=child, before=j)
            rows.append(self.forward(ctx, [(child.id, j)], [child.token_ids[j]], [start + j]))
        return torch.cat(rows)


def assert_close(tiny, got: torch.Tensor, want: torch.Tensor, dists: torch.Tensor, what: str) -> None:
    """Log-probs equal to the dtype's rounding bound (tests/floats.py), scaled by the distributions
    ``dists`` they were taken from (a log-prob's rounding follows its whole row's logits)."""
    tol = reassociation_tol(tiny, [float(dists.abs().max())])
    err = float((got.float() - want).abs().max())
    assert err <= tol, f"{what}: log-probs differ by {err:.3g} (tolerance {tol:.3g})"


def check_block(tiny, rt: Runtime, ref: Reference, node: Node, replayed: torch.Tensor) -> None:
    """``node``'s scored tokens and next-token distribution equal the replay; its retained tokens sit
    at their true positions."""
    if node.logprobs and node.parent is not None:  # token 0 is scored by the parent's stored logits
        got = torch.tensor(node.logprobs[1:])
        want = replayed[:-1].gather(-1, torch.tensor(node.token_ids[1:]).view(-1, 1)).squeeze(-1)
        assert_close(tiny, got, want, replayed[:-1], f"{node!r} token log-probs")
    last = replayed[-1]
    assert_close(tiny, rt.next_token_logprobs(node), last, last, f"{node!r} next-token log-probs")
    assert_retained_positions(rt, node)


def assert_retained_positions(rt: Runtime, node: Node) -> None:
    if node.id in rt.store:
        blk = rt.store.get(node.id)
        assert blk.positions.tolist() == [path_offset(node) + int(i) for i in blk.kept]


def evicted_on_path(rt: Runtime, node: Node) -> int:
    return sum(a.length - rt.residency(a)["device"] for a in node.path())


class Driver:
    """A runtime, its recorder and the reference, stepped together."""

    def __init__(self, tiny, rt: Runtime) -> None:
        self.tiny, self.rt, self.rec, self.ref = tiny, rt, Recorder(rt), Reference(tiny.model)

    def new_tree(self, text: str) -> Node:
        root = self.rt.new_tree(text)
        forwards = self.rec.take()
        check_block(self.tiny, self.rt, self.ref, root, self.ref.prefill(root, forwards))
        return root

    def append(self, node: Node, text: str) -> Node:
        child = self.rt.append(node, text)
        forwards = self.rec.take()
        check_block(self.tiny, self.rt, self.ref, child, self.ref.prefill(child, forwards))
        return child

    def expand(self, node: Node) -> Node:
        (child,) = self.rt.expand(node, 1, GREEDY)
        forwards = self.rec.take()
        check_block(self.tiny, self.rt, self.ref, child, self.ref.decode(child, forwards))
        return child

    def compress(self, target: int) -> None:
        self.rt.compress(target)
        assert not self.rec.take(), "compress runs no forward"
        for node in self.rt.nodes.values():
            assert_retained_positions(self.rt, node)


@pytest.mark.parametrize("policy", SHRINKING)
def test_chunked_prefill_under_a_budget_keeps_true_positions(tiny, policy):
    """A budget from the start: the prompt is prefilled in chunks and compressed while it grows; each
    chunk, a forced block and a greedy child are computed at true positions over what was retained."""
    budget = 48
    d = Driver(tiny, Runtime(tiny, policy=policy, budget_tokens=budget))
    root = d.new_tree(LONG_PROMPT)
    assert root.length > 2 * budget and len(d.ref.evicted) > 2
    assert max(d.ref.evicted) > 0, "later chunks ran over a prompt with tokens evicted"
    forced = d.append(root, FORCED)
    child = d.expand(forced)
    d.expand(child)
    assert evicted_on_path(d.rt, child) > 0 and d.rt.metrics.peak_device_tokens <= budget
    assert d.rt.metrics.recomputed_tokens == 0


@pytest.mark.parametrize("policy", EVICTING)
def test_compress_after_a_whole_prefill_keeps_true_positions(tiny, policy):
    """Prefill whole, then ``rt.compress``: the retained tokens keep their positions, and blocks added
    afterwards (forced, sampled, on two branches) sit at the true path length."""
    d = Driver(tiny, Runtime(tiny, policy=policy))
    root = d.new_tree(LONG_PROMPT)
    left = d.append(root, FORCED)
    left_kid = d.expand(left)
    right = d.append(root, " 8 - 6 = 2 (left: 2 4 4)\n")  # the active path is now root -> right
    target = root.length // 3
    d.compress(target)
    evicted = {n.id: n.length - d.rt.residency(n)["device"] for n in (root, left, left_kid, right)}
    if policy == "arbor":  # the active path stays whole; the other branch went to the host tier
        assert evicted[root.id] == evicted[right.id] == 0 and evicted[left.id] + evicted[left_kid.id] > 0
    else:
        assert d.rt.store.resident_tokens <= target and sum(evicted.values()) > 0
    deeper = d.append(left_kid, FORCED)  # back to the compressed branch (arbor brings it back first)
    d.expand(deeper)
    d.expand(right)
    if policy == "arbor":
        # every forward read its whole path (rehydrated where evicted): the physical length of the
        # context equals the path length, so for arbor the replay checks the restored tokens' places
        assert d.rt.metrics.rehydrations > 0 and max(d.ref.evicted) == 0
    else:
        assert max(d.ref.evicted) > 0


def test_the_reference_is_a_plain_forward_when_nothing_is_evicted(tiny):
    """The replay itself: with nothing evicted it equals one transformers forward over the whole path."""
    d = Driver(tiny, Runtime(tiny, policy="full"))
    root = d.new_tree(LONG_PROMPT)
    forced = d.append(root, FORCED)
    ids = torch.tensor([d.rt.path_token_ids(forced)])
    with torch.no_grad():
        whole = torch.log_softmax(tiny.model(input_ids=ids).logits[0, -1].float(), dim=-1)
    assert_close(tiny, d.rt.next_token_logprobs(forced), whole, whole, "full")
    assert max(d.ref.evicted) == 0
