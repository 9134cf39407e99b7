"""MSVE calibration helpers: leave-one-out block effects and the least-squares weight fit.

For a recorded full-retention tree, masking one block (removing its KV from the context) and
teacher-forcing what followed it measures how much that block mattered: the drop in
log-likelihood of the recorded continuation. Fitting those drops on the MSVE signals gives the
weights ``policy=arbor`` reads.
"""

from __future__ import annotations

import math

import torch

from arbor_runtime.policies.msve import SIGNALS, MSVEWeights
from arbor_runtime.runtime import Runtime
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import Node


def continuation_loglik(rt: Runtime, context: list[Node], leaf: Node) -> float:
    """Mean log-probability of ``leaf``'s tokens 1.. teacher-forced after ``context``'s KV.

    The leaf's first token is left out: it is predicted from the context's last position, which
    changes meaning when the block right before the leaf is the one masked.
    """
    ids = [n.id for n in context]
    keys, values, _ = rt.store.gather(ids)
    cache = rt.backend.new_cache([(keys, values)], capacity=leaf.length)
    positions = torch.arange(leaf.start_pos, leaf.end_pos).unsqueeze(0)
    logits = rt.backend.forward(cache, torch.tensor([leaf.token_ids]), positions, logits_to_keep=0)[0]
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)
    target = torch.tensor(leaf.token_ids[1:])
    return float(logp.gather(-1, target.view(-1, 1)).mean())


def leave_one_out(rt: Runtime, leaf: Node) -> dict[int, float]:
    """Per block on ``leaf``'s path (root and leaf excluded): LL drop of the leaf when it is masked."""
    path = leaf.path()
    if leaf.length < 2 or len(path) < 3:
        return {}
    base = continuation_loglik(rt, path[:-1], leaf)
    return {b.id: base - continuation_loglik(rt, [n for n in path[:-1] if n is not b], leaf) for b in path[1:-1]}


def regenerate(rt: Runtime, context: list[Node], max_new_tokens: int, stop: list[str]) -> str:
    """Greedy text that follows ``context``'s KV (masked blocks simply left out of ``context``).

    The context's last token is fed again as the first input (its KV is dropped from the gathered
    context), so the first new token sees the masked context too.
    """
    keys, values, _ = rt.store.gather([n.id for n in context])
    last = context[-1]
    cache = rt.backend.new_cache([(keys[:, :, :-1], values[:, :, :-1])], capacity=max_new_tokens + 1)
    token, pos, out = last.token_ids[-1], last.end_pos - 1, []
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=stop)
    for _ in range(max_new_tokens):
        logits = rt.backend.forward(cache, torch.tensor([[token]]), torch.tensor([[pos]]))[0, -1]
        token, pos = int(logits.argmax()), pos + 1
        out.append(token)
        text = rt.tokenizer.decode(out)
        if token in rt._eos_ids or any(s in text for s in params.stop):
            break
    return rt.tokenizer.decode(out)


def fit_weights(features: list[tuple[float, ...]], effects: list[float]) -> tuple[MSVEWeights, float]:
    """Least squares of standardized effects on the signals (with a bias).

    Args:
        features: per sample, the signals in :data:`SIGNALS` order; effects: LL drops.
    Returns:
        the weights and the fit's R^2.
    """
    if len(effects) < len(SIGNALS) + 2:
        raise ValueError(f"calibration needs at least {len(SIGNALS) + 2} samples, got {len(effects)}")
    x = torch.tensor(features, dtype=torch.float64)
    y = torch.tensor(effects, dtype=torch.float64)
    y = (y - y.mean()) / (y.std() + 1e-12)
    design = torch.cat([torch.ones(len(y), 1, dtype=torch.float64), x], dim=1)
    coef = torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1)
    pred = design @ coef
    r2 = 1.0 - float(((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum().clamp_min(1e-12))
    values = [float(c) if math.isfinite(float(c)) else 0.0 for c in coef]
    return MSVEWeights(bias=values[0], **dict(zip(SIGNALS, values[1:], strict=True))), r2
