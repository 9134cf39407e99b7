"""The log-sum-exp merge: attention over disjoint key sets combined exactly.

    s = logsumexp_i s_i,    o = sum_i exp(s_i - s) o_i          (DeFT, Hydragen, FlashInfer cascade)

A leaf: the kernels' chunked fallback, the dense tree attention and sparse decode all merge with it.
"""

from __future__ import annotations

import torch


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact combination of attention over two disjoint key sets.

    Args:
        out_a, out_b: (..., M, D) normalized outputs; lse_a, lse_b: (..., M) log-sum-exp of the scores.
    Returns:
        (out, lse) of attention over the union, float32.
    """
    lse = torch.logaddexp(lse_a.float(), lse_b.float())
    wa = torch.exp(lse_a.float() - lse).nan_to_num_(0.0).unsqueeze(-1)
    wb = torch.exp(lse_b.float() - lse).nan_to_num_(0.0).unsqueeze(-1)
    return out_a.float() * wa + out_b.float() * wb, lse
