"""MSVE calibration helpers: leave-one-out block effects and the least-squares weight fit.

For a recorded full-retention tree, masking one block (removing its KV from the context) and
teacher-forcing what followed it measures how much that block mattered: the drop in
log-likelihood of the recorded continuation. Fitting those drops on the MSVE signals gives the
weights ``policy=arbor`` reads.
"""

from __future__ import annotations

import math

import torch

from arbor_runtime.attention.tree import TreeBatch, context_groups
from arbor_runtime.batch import Group, Piece
from arbor_runtime.policies.msve import SIGNALS, MSVEWeights
from arbor_runtime.runtime import Runtime
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import Node
from research.msve.heldout import fit, r2


def continuation_loglik(rt: Runtime, context: list[Node], leaf: Node) -> float:
    """Mean log-probability of ``leaf``'s tokens 1.. teacher-forced after ``context``'s KV.

    The leaf's first token is left out: it is predicted from the context's last position, which
    changes meaning when the block right before the leaf is the one masked. Nothing is stored.
    """
    logits = _forward_over(rt, _groups(rt, context), leaf.token_ids, leaf.start_pos, logits_to_keep=0)
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

    The context's last token is fed again as the first input (its own KV is left out of the
    context), so the first new token sees the masked context too. Nothing is stored: each step
    re-feeds the new tokens (a few dozen) over the context read in place.
    """
    last = context[-1]
    groups = _groups(rt, context, drop_last_token=True)
    fed, out = [last.token_ids[-1]], []
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=stop)
    for _ in range(max_new_tokens):
        logits = _forward_over(rt, groups, fed, last.end_pos - 1, logits_to_keep=1)
        token = int(logits[-1].argmax())
        out.append(token)
        fed.append(token)
        text = rt.tokenizer.decode(out)
        if token in rt._eos_ids or any(s in text for s in params.stop):
            break
    return rt.tokenizer.decode(out)


def _groups(rt: Runtime, context: list[Node], drop_last_token: bool = False) -> list[Group]:
    """One context group per block of ``context`` (optionally without the last block's last token)."""
    groups = context_groups(rt.store, [[n.id for n in context]])
    if drop_last_token:
        last = context[-1]
        grp = next(g for g in groups if g.block_id == last.id)
        grp.pieces = [p for piece in grp.pieces for p in _without(piece, last.length - 1)]
    return groups


def _without(piece: Piece, token: int) -> list[Piece]:
    """``piece`` with block-local ``token`` left out (split around it)."""
    hit = torch.nonzero(piece.idx == token).flatten()
    if not hit.numel():
        return [piece]
    i = int(hit[0])
    parts = [
        Piece(piece.block_id, piece.start, piece.idx[:i]),
        Piece(piece.block_id, piece.start + i + 1, piece.idx[i + 1 :]),
    ]
    return [p for p in parts if p.length]


def _forward_over(rt: Runtime, groups: list[Group], ids: list[int], start_pos: int, logits_to_keep: int):
    """(k, V) logits of ``ids`` at positions start_pos.. over the given context, storing nothing."""
    n = len(ids)
    batch = TreeBatch(rt.store.pool, groups, 1, n, torch.full((1, n), -1), kernel=rt.backend.kernel)
    positions = torch.arange(start_pos, start_pos + n).unsqueeze(0)
    return rt.backend.forward(batch, torch.tensor([ids]), positions, logits_to_keep)[0]


def fit_weights(
    features: list[tuple[float, ...]], effects: list[float], only: str | None = None
) -> tuple[MSVEWeights, float | None]:
    """Least squares of standardized effects on the signals (with a bias).

    Args:
        features: per sample, the signals in :data:`SIGNALS` order; effects: LL drops.
        only: fit that one signal alone (a bias and its weight; the other weights 0).
    Returns:
        the weights and the fit's in-sample R^2 (:func:`research.msve.heldout.r2`; None for constant effects).
    """
    if len(effects) < len(SIGNALS) + 2:
        raise ValueError(f"calibration needs at least {len(SIGNALS) + 2} samples, got {len(effects)}")
    x = torch.tensor(features, dtype=torch.float64)
    if only is not None:
        x = x * torch.tensor([float(name == only) for name in SIGNALS], dtype=torch.float64)
    y = torch.tensor(effects, dtype=torch.float64)
    y = (y - y.mean()) / (y.std() + 1e-12)
    coef = fit(x, y)
    values = [float(c) if math.isfinite(float(c)) else 0.0 for c in coef]
    return MSVEWeights(bias=values[0], **dict(zip(SIGNALS, values[1:], strict=True))), r2(x, y, coef)
