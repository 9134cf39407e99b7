"""KVP (Learning to Evict, arXiv 2602.10238): learned per-head scorers rank tokens; tree-blind, dropped.

Every device token is scored once by the per-layer, per-KV-head scorers of
:mod:`arbor_runtime.policies.kvp_scorer` from its own K, V and position; the scores are cached
per block (on the host, (G,) floats per token), so a plan scores only the tokens it has not seen
(after a decode step: the new token). With ``granularity=token`` (the default) a token is kept or
evicted in every head at once, so the per-head scores become a whole-token score (each head's
softmax share, averaged over heads: :func:`pooled_token_scores`); with ``granularity=head`` that
score only sets how many slots each block keeps, and each (layer, KV head) keeps its own top tokens
by its own scorer, the paper's setting. ``policy=kvp`` keeps the top tokens of the flattened pool
within the target; ``policy=arbor policy.token_scorer=kvp`` uses the same scores to choose tokens
inside each block. The weights are found by model fingerprint among the files shipped with the
package, or read from ``weights``; weights of another model are refused.

The query window. A KVP score comes from a token's own K, V and position and was trained as its
share of the attention of queries that come *after the whole context*; it cannot see how recent a
token is. Compressing once after a whole prefill never asks it to (nothing after the context is
evicted), but under a budget set from the start the runtime prefills a prompt or a forced block in
chunks and plans between them: the plan that admits the next chunk then ranks the tokens that chunk
is about to read most (the chunk just written, the question being forced) by a score blind to that,
and pure ranking evicts them (SmolLM2, 787-token GSM8K context gsm8k:6:0, 25% kept, 16
teacher-forced tokens: KL 0.33 vs h2o 0.09; with the window 0.05). So, like H2O's recent tokens and
SnapKV's window, the newest ``recent_ratio`` of the target always stays and the learned ranking
fills the rest. The window is not free: compressing a whole prefill once, it takes room the ranking
would use (two 503-token contexts, 25% kept: KL 0.097 with it, 0.051 without; see
``scripts/bench_kvp.py --protocol compress|budget --variants kvp-pure=recent_ratio:0``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from arbor_runtime.policies.base import MemoryView, split_tokens
from arbor_runtime.policies.kvp_scorer import KVPScorer, pooled_token_scores
from arbor_runtime.policies.kvp_weights import load_weights, model_fingerprint, shipped_weights
from arbor_runtime.policies.scorer import FlatPool, ScorerPolicy

log = logging.getLogger(__name__)
#: default share of a plan's target kept as the newest tokens (the query window; see the module docstring)
RECENT_RATIO = 0.5


class KVPScores:
    """Cached KVP head scores of every block's device tokens, and their whole-token pooling.

    Args:
        weights: a weights file path, or None for the file shipped for the bound model.
    """

    def __init__(self, weights: str | None = None) -> None:
        self.weights = weights
        self.scorer: KVPScorer | None = None
        self.scored_tokens = 0  # tokens run through the scorer so far (cost accounting)
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (G, length) scores, (length,) seen

    def bind(self, model: torch.nn.Module) -> None:
        """Load the weights for ``model`` (by fingerprint) onto its device; a mismatch raises."""
        fingerprint = model_fingerprint(model)
        path = self.weights if self.weights is not None else shipped_weights(fingerprint)
        loaded = load_weights(path, fingerprint)
        self.scorer = loaded.scorer.to(next(model.parameters()).device)
        log.info("kvp weights %s for model %s", loaded.path, fingerprint)

    def head_scores(self, view: MemoryView) -> list[torch.Tensor]:
        """Per block of ``view``, the (G, T_kept) head scores of its device tokens (in ``kv.kept`` order)."""
        if self.scorer is None:
            raise RuntimeError("the KVP scorer is not bound to a model: build the policy through Runtime")
        if view.read is None:
            raise RuntimeError("KVP scores need the K/V of the tokens: the MemoryView has no read function")
        live = {b.node.id for b in view.blocks}
        self._cache = {i: c for i, c in self._cache.items() if i in live}
        return [self._block_scores(view, b.node.id, b.kv) for b in view.blocks]

    def token_scores(self, view: MemoryView) -> torch.Tensor:
        """(N,) whole-token scores of the flattened pool (blocks in order, ``kv.kept`` within each)."""
        per_block = self.head_scores(view)
        if not per_block:
            return torch.zeros(0)
        return pooled_token_scores(torch.cat(per_block, dim=1))

    def block_token_scores(self, view: MemoryView) -> dict[int, torch.Tensor]:
        """Per block id, (length,) whole-token scores indexed by block-local token (evicted: -inf)."""
        pooled = self.token_scores(view)
        out, offset = {}, 0
        for b in view.blocks:
            kept = b.kv.kept.cpu()
            scores = torch.full((b.kv.length,), float("-inf"))
            scores[kept] = pooled[offset : offset + kept.numel()]
            out[b.node.id], offset = scores, offset + kept.numel()
        return out

    def held_scores(self, block_id: int, held: torch.Tensor) -> torch.Tensor:
        """(L, H_kv, K) each head's own score of the tokens it holds (``held``, (L, H_kv, K)
        block-local tokens), from the cache (every device token was scored while it was whole)."""
        scores, seen = self._cache[block_id]
        if not bool(seen[held].all()):
            raise RuntimeError(f"kvp: block {block_id} holds tokens that were never scored")
        layers, kv_heads = held.shape[:2]
        return scores.reshape(layers, kv_heads, -1).gather(2, held)

    def split_block(self, block_id: int, prefix_id: int, at: int) -> None:
        """A block cut in two (``Policy.split_block``): its cached scores are cut with it."""
        split_tokens(self._cache, block_id, prefix_id, at)

    def _block_scores(self, view: MemoryView, block_id: int, kv) -> torch.Tensor:
        g = self.scorer.shape.heads
        scores, seen = self._cache.get(block_id, (torch.zeros(g, 0), torch.zeros(0, dtype=torch.bool)))
        if seen.numel() < kv.length:  # the block grew (chunked prefill, decode): room for new tokens
            grow = kv.length - seen.numel()
            scores = torch.cat([scores, torch.zeros(g, grow)], dim=1)
            seen = torch.cat([seen, torch.zeros(grow, dtype=torch.bool)])
        kept = kv.kept.cpu()
        new = kept[~seen[kept]]
        if new.numel():
            keys, values = view.read(block_id, new)
            with torch.no_grad():
                scores[:, new] = self.scorer.score_layers(keys, values, new + kv.start_pos).cpu()
            seen[new] = True
            self.scored_tokens += int(new.numel())
        self._cache[block_id] = (scores, seen)
        return scores[:, kept]


@dataclass(slots=True)
class KVPPolicy(ScorerPolicy):
    """Keep the tokens with the highest learned KVP scores, flattened over blocks (tree-blind).

    Attributes:
        weights: KVP weights file (None = the file shipped for the model in use, by fingerprint).
        sink_tokens: first tokens of the pool always kept (0, the default: none).
        recent_ratio: share of the target kept as the newest tokens of the pool, the query window
            (see the module docstring); 0 = pure KVP ranking.
        scores: the cached scorer (built from ``weights``; not a constructor argument).
    """

    name = "kvp"
    weights: str | None = None
    sink_tokens: int = 0
    recent_ratio: float = RECENT_RATIO
    scores: KVPScores = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ScorerPolicy.__post_init__(self)
        if not isinstance(self.sink_tokens, int) or self.sink_tokens < 0:
            raise ValueError(f"kvp sink_tokens={self.sink_tokens!r} must be a number of tokens >= 0")
        if (
            isinstance(self.recent_ratio, bool)
            or not isinstance(self.recent_ratio, int | float)
            or not (0.0 <= self.recent_ratio < 1.0)
        ):
            raise ValueError(f"kvp recent_ratio={self.recent_ratio!r} must be a share of the target in [0, 1)")
        self.scores = KVPScores(self.weights)

    def bind(self, model: torch.nn.Module) -> None:
        """Called by the runtime with its model: loads the matching weights."""
        self.scores.bind(model)

    def sinks(self, cap: int) -> int:
        return self.sink_tokens

    def score(self, view: MemoryView, pool: FlatPool, protected: torch.Tensor) -> torch.Tensor:
        """(N,) whole-token KVP scores (:meth:`KVPScores.token_scores`; new tokens are scored here)."""
        return self.scores.token_scores(view)

    def recent_window(self, cap: int) -> int:
        """Newest tokens of the pool a plan down to ``cap`` tokens keeps whatever their scores."""
        return int(cap * self.recent_ratio)

    def head_scores(self, view: MemoryView, block: int, held: torch.Tensor, must: torch.Tensor) -> torch.Tensor:
        """(L, H_kv, K) each (layer, KV head) scorer's own scores of the tokens that head holds."""
        return self.scores.held_scores(view.blocks[block].node.id, held)
