"""Train KVP scorers on collected sequences, for every budget at once.

Objective. KVP's reward is the holistic one: the future attention mass a head retains when it
keeps its top-scored tokens, summed over budgets 10%..90% of the context (the area under the
retained-mass curve). Three objectives aim at it (``--loss``): the paper's, which samples, and two
differentiable surrogates that do not:

- ``rloo``: the paper's estimator. Each head's scores define a Plackett-Luce distribution over rankings;
  :data:`RLOO_SAMPLES` rankings are drawn per head (Gumbel perturbation, then sort), each rewarded with its
  retained-mass AUC over budgets 10..90% normalised by the oracle ranking's, and the policy gradient
  uses the leave-one-out mean of the other samples' rewards as each one's baseline (REINFORCE leave-one-out).

- ``listnet``: cross-entropy between each head's normalised future attention ``t`` and
  ``softmax(s)`` (reported as KL(t || softmax(s))). Its minimiser is ``s = log t + c``, which
  ranks every token by its attention and so maximises retained mass at *every* budget at once;
  it also calibrates the scores as attention shares, which the whole-token pooling needs.
- ``budgets``: the retained mass itself, made smooth: at each budget b in 10..90% a token counts
  as kept with weight ``sigmoid((z - z_b) / temperature)``, z the head's standardised scores and
  z_b the (detached) score of its b-th best token; the loss is minus the mean over budgets.

Both are reported with the same held-out metric, :func:`retained_auc` (hard top-k, budgets
10..90%), next to the heuristics (recency, StreamingLLM, key norm) and the oracle.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from arbor_runtime.policies.kvp_scorer import KVPScorer, ScorerShape, pooled_token_scores
from research.kvp.collect import Sequence

BUDGETS = tuple(round(0.1 * i, 1) for i in range(1, 10))
LOSSES = ("listnet", "budgets", "rloo")
#: rankings drawn per head and step by ``rloo`` (each one's baseline is the mean of the others)
RLOO_SAMPLES = 8


def head_tensors(seq: Sequence) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sequence as scorer input: keys, values (G, C, D) float32, positions (C,), targets (G, C)
    (each head's future attention normalised to sum 1)."""
    layers, heads, c, d = seq.keys.shape
    att = seq.attention.reshape(layers * heads, c).float()
    target = att / att.sum(-1, keepdim=True).clamp_min(1e-12)
    return seq.keys.reshape(-1, c, d).float(), seq.values.reshape(-1, c, d).float(), torch.arange(c), target


def listnet_loss(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over heads of KL(target || softmax(scores)). scores, target: (G, C)."""
    entropy = -(target * torch.log(target.clamp_min(1e-12))).sum(-1)
    return (-(target * F.log_softmax(scores, dim=-1)).sum(-1) - entropy).mean()


def budgets_loss(scores: torch.Tensor, target: torch.Tensor, temperature: float = 0.3) -> torch.Tensor:
    """Minus the smooth retained mass, averaged over heads and budgets 10..90%. (G, C) each."""
    z = (scores - scores.mean(-1, keepdim=True)) / scores.std(-1, keepdim=True).clamp_min(1e-6)
    ranked = z.detach().sort(dim=-1, descending=True).values
    c = scores.shape[-1]
    total = scores.new_zeros(())
    for b in BUDGETS:
        k = max(1, math.ceil(b * c))
        threshold = (ranked[:, k - 1 : k] + ranked[:, min(k, c - 1) : min(k, c - 1) + 1]) / 2
        total = total + (target * torch.sigmoid((z - threshold) / temperature)).sum(-1).mean()
    return -total / len(BUDGETS)


def plackett_luce_log_prob(scores: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Log-probability of each ranking under Plackett-Luce with ``scores`` (G, C): ``order`` (S, G, C)
    lists token indices best first. Returns (S, G): sum over ranks j of s_j - logsumexp(s_j, s_j+1, ...)."""
    ranked = scores.unsqueeze(0).expand(order.shape[0], -1, -1).gather(-1, order)
    rest = torch.logcumsumexp(ranked.flip(-1), dim=-1).flip(-1)
    return (ranked - rest).sum(-1)


def ranking_auc(order: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Retained-mass AUC (budgets 10..90%) of rankings ``order`` (S, G, C) of heads' ``target`` (G, C): (S, G)."""
    cum = target.unsqueeze(0).expand(order.shape[0], -1, -1).gather(-1, order).cumsum(-1)
    c = target.shape[-1]
    picks = torch.tensor([max(1, math.ceil(b * c)) - 1 for b in BUDGETS])
    return cum[..., picks].mean(-1)


def rloo_loss(scores: torch.Tensor, target: torch.Tensor, samples: int = RLOO_SAMPLES) -> torch.Tensor:
    """REINFORCE leave-one-out over Plackett-Luce rankings (the KVP paper's objective). (G, C) each.

    The reward of a ranking is its retained-mass AUC over the oracle's (1 for the best ranking); the
    loss is minus the mean of advantage x log-probability (its gradient is the policy gradient)."""
    gumbel = -torch.log(-torch.log(torch.rand(samples, *scores.shape).clamp(1e-20, 1.0)))
    order = (scores.detach().unsqueeze(0) + gumbel).argsort(dim=-1, descending=True)  # (S, G, C)
    oracle = ranking_auc(target.argsort(dim=-1, descending=True).unsqueeze(0), target)  # (1, G)
    reward = ranking_auc(order, target) / oracle.clamp_min(1e-12)
    baseline = (reward.sum(0, keepdim=True) - reward) / (samples - 1)
    return -((reward - baseline).detach() * plackett_luce_log_prob(scores, order)).mean()


LOSS_FNS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "listnet": listnet_loss,
    "budgets": budgets_loss,
    "rloo": rloo_loss,
}


def retained_auc(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per head, the attention mass kept by its top-scored tokens, averaged over budgets 10..90%.

    scores, target: (G, C) (target rows sum to 1). Returns (G,).
    """
    order = scores.argsort(dim=-1, descending=True)
    cum = target.gather(-1, order).cumsum(-1)  # (G, C): mass of the top-j tokens
    c = scores.shape[-1]
    picks = torch.tensor([max(1, math.ceil(b * c)) - 1 for b in BUDGETS])
    return cum[:, picks].mean(-1)


def token_retained_auc(head_scores: torch.Tensor, target: torch.Tensor) -> float:
    """Whole-token version (the runtime keeps a token in every head): tokens ranked by the pooled
    score, retained mass averaged over heads and budgets 10..90%."""
    pooled = pooled_token_scores(head_scores)
    return float(retained_auc(pooled.unsqueeze(0), target.mean(0, keepdim=True)).item())


def baseline_scores(name: str, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(G, C) scores of a heuristic: recency, streaming (4 sinks + recency), knorm (small key norm)."""
    g = keys.shape[0]
    pos = positions.float().expand(g, -1)
    if name == "recency":
        return pos
    if name == "streaming":
        return torch.where(pos < 4, torch.full_like(pos, 1e9), pos)
    if name == "knorm":
        return -keys.norm(dim=-1)
    raise ValueError(f"unknown baseline {name!r}; valid: recency, streaming, knorm")


@torch.no_grad()
def evaluate(scorer: KVPScorer, seqs: list[Sequence], baselines: tuple[str, ...] = ()) -> dict[str, float]:
    """Held-out retained-mass AUC (budgets 10..90%) per head and per whole token, for the scorer,
    the oracle and each baseline."""
    sums: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value / len(seqs)

    for seq in seqs:
        k, v, pos, target = head_tensors(seq)
        candidates = {"kvp": scorer(k, v, pos), "oracle": torch.log(target + 1e-12)} | {
            b: baseline_scores(b, k, pos) for b in baselines
        }
        for name, s in candidates.items():
            add(f"{name}/head_auc", float(retained_auc(s, target).mean()))
            add(f"{name}/token_auc", token_retained_auc(s.float(), target))
    return sums


@dataclass(slots=True)
class TrainConfig:
    """Training settings: loss (listnet | budgets | rloo), epochs over the training sequences, Adam lr
    (cosine to 10%), weight decay, gradient clip, evaluation every ``eval_every`` steps, seed."""

    loss: str = "listnet"
    epochs: int = 6
    lr: float = 3e-3
    weight_decay: float = 1e-4
    clip: float = 1.0
    eval_every: int = 100
    seed: int = 0
    embed: int = 32
    hidden: int = 32

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r}; valid: {', '.join(LOSSES)}")
        if self.epochs < 1 or self.lr <= 0 or self.eval_every < 1:
            raise ValueError(f"epochs={self.epochs}, lr={self.lr}, eval_every={self.eval_every} must be positive")


@dataclass(slots=True)
class TrainResult:
    """The trained scorer, its loss per step, held-out evaluations (step, metrics), seconds."""

    scorer: KVPScorer
    losses: list[float] = field(default_factory=list)
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    seconds: float = 0.0


def train(
    shape: ScorerShape,
    train_seqs: list[Sequence],
    val_seqs: list[Sequence],
    cfg: TrainConfig,
    on_step: Callable[[int, int, float], None] | None = None,
) -> TrainResult:
    """Train a scorer bank; one step = one sequence, all heads at once. ``on_step(step, total, loss)``."""
    if not train_seqs:
        raise ValueError("no training sequences")
    torch.manual_seed(cfg.seed)
    scorer = KVPScorer(shape, seed=cfg.seed)
    opt = torch.optim.AdamW(scorer.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = cfg.epochs * len(train_seqs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / total)))
    loss_fn, rng = LOSS_FNS[cfg.loss], random.Random(cfg.seed)
    result, start, step = TrainResult(scorer), time.perf_counter(), 0
    for _ in range(cfg.epochs):
        order = list(range(len(train_seqs)))
        rng.shuffle(order)
        for i in order:
            k, v, pos, target = head_tensors(train_seqs[i])
            loss = loss_fn(scorer(k, v, pos), target)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(scorer.parameters(), cfg.clip)
            opt.step()
            sched.step()
            step += 1
            result.losses.append(float(loss.detach()))
            if val_seqs and (step % cfg.eval_every == 0 or step == total):
                result.evals.append((step, evaluate(scorer.eval(), val_seqs)))
                scorer.train()
            if on_step is not None:
                on_step(step, total, result.losses[-1])
    result.seconds = time.perf_counter() - start
    scorer.eval().requires_grad_(False)
    return result
