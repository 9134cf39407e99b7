"""KVP scorers (Learning to Evict, arXiv 2602.10238): one small network per layer and KV head.

Each cached token is scored from its own key and value vectors and its position, nothing else, so a
token is scored once, when it is first seen, and the score stays valid while the cache changes.
All ``G = layers x kv_heads`` networks run as one batched computation (weights stacked on a
leading head axis):

    h = LayerNorm(k @ Wk + v @ Wv + f(pos, |k|, |v|) @ Wf + b)        # (G, N, E)
    s = SiLU(h @ W1 + b1) @ w2 + b2                                    # (G, N)

``f`` are a few scalar features: log position and sink indicators (the paper's learned position
embedding, made continuous so longer contexts need no new rows) and the log norms of k and v
(the LayerNorm would otherwise hide the norm, a known eviction signal). The score is trained as
a log attention share: ``softmax(s)`` over a head's tokens estimates the share of that head's
future attention each token receives (see ``research/kvp/train.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

#: scalar features per token, in this order (see :func:`token_features`)
FEATURES = ("log_pos", "pos_is_0", "pos_lt_4", "pos_lt_16", "log_k_norm", "log_v_norm")


@dataclass(frozen=True, slots=True)
class ScorerShape:
    """Geometry of a scorer bank: ``layers x kv_heads`` heads reading ``head_dim`` K/V vectors.

    Attributes:
        embed: width E of the projection of K, V and features; hidden: width of the MLP.
    """

    layers: int
    kv_heads: int
    head_dim: int
    embed: int = 32
    hidden: int = 32

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "embed", "hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"scorer {name}={value!r} must be a positive integer")

    @property
    def heads(self) -> int:
        return self.layers * self.kv_heads


def token_features(positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Scalar features of every token for every head.

    Args:
        positions: (N,) original position ids; keys, values: (G, N, D).
    Returns:
        (G, N, len(FEATURES)) float32.
    """
    pos = positions.to(device=keys.device, dtype=torch.float32)
    per_token = torch.stack([torch.log1p(pos) / 10.0, pos == 0, pos < 4, pos < 16], dim=-1).float()
    norms = torch.stack([keys.float().norm(dim=-1), values.float().norm(dim=-1)], dim=-1)
    return torch.cat([per_token.expand(keys.shape[0], -1, -1), torch.log(norms + 1e-6)], dim=-1)


class KVPScorer(nn.Module):
    """A bank of per-head scorers, batched over heads. Deterministic initialisation from ``seed``."""

    def __init__(self, shape: ScorerShape, seed: int = 0) -> None:
        super().__init__()
        self.shape = shape
        g, d, e, h, f = shape.heads, shape.head_dim, shape.embed, shape.hidden, len(FEATURES)
        gen = torch.Generator().manual_seed(seed)

        def init(*size: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*size, generator=gen) / math.sqrt(fan_in))

        self.w_k, self.w_v, self.w_f = init(g, d, e, fan_in=d), init(g, d, e, fan_in=d), init(g, f, e, fan_in=f)
        self.b_in = nn.Parameter(torch.zeros(g, e))
        self.ln_w, self.ln_b = nn.Parameter(torch.ones(g, 1, e)), nn.Parameter(torch.zeros(g, 1, e))
        self.w_1, self.b_1 = init(g, e, h, fan_in=e), nn.Parameter(torch.zeros(g, 1, h))
        self.w_2, self.b_2 = init(g, h, 1, fan_in=h), nn.Parameter(torch.zeros(g, 1, 1))

    def forward(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Scores (log attention shares up to a constant per head).

        Args:
            keys, values: (G, N, D) one row per head (layer-major: head g = layer * kv_heads + h);
            positions: (N,) original position ids.
        Returns:
            (G, N) float32.
        """
        self._check(keys, values, positions)
        k, v = keys.float(), values.float()
        feats = token_features(positions, k, v)
        x = torch.bmm(k, self.w_k) + torch.bmm(v, self.w_v) + torch.bmm(feats, self.w_f) + self.b_in[:, None]
        x = F.layer_norm(x, (self.shape.embed,)) * self.ln_w + self.ln_b
        x = F.silu(torch.bmm(x, self.w_1) + self.b_1)
        return (torch.bmm(x, self.w_2) + self.b_2).squeeze(-1)

    def score_layers(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Scores of tokens given as the KV store holds them: keys, values (L, H_kv, N, D) -> (G, N)."""
        layers, heads, n, d = keys.shape
        return self(keys.reshape(layers * heads, n, d), values.reshape(layers * heads, n, d), positions)

    def _check(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        s = self.shape
        want = (s.heads, keys.shape[1], s.head_dim)
        if keys.dim() != 3 or tuple(keys.shape) != want or values.shape != keys.shape:
            raise ValueError(
                f"KVP scorer for {s.layers} layers x {s.kv_heads} KV heads of {s.head_dim} expects keys and values "
                f"of shape (G={s.heads}, N, {s.head_dim}); got {tuple(keys.shape)} and {tuple(values.shape)}"
            )
        if positions.shape != (keys.shape[1],):
            raise ValueError(f"positions {tuple(positions.shape)} must be (N,) = ({keys.shape[1]},)")


def pooled_token_scores(head_scores: torch.Tensor) -> torch.Tensor:
    """Whole-token scores for a runtime that keeps or evicts a token in every head at once.

    Each head's scores become its estimated attention shares (softmax over the tokens given), and
    a token's score is its share averaged over heads: the expected retained attention mass per
    head when a set of tokens is kept. head_scores: (G, N) -> (N,) float32.
    """
    if head_scores.shape[-1] == 0:
        return head_scores.new_zeros(0)
    return torch.softmax(head_scores.float(), dim=-1).mean(0)
