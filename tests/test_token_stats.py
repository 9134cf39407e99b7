"""The per-token statistics every sampled token records (arbor_runtime/sampling.py ``token_stats``)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("scale", [0.1, 4.0, 60.0])  # flat, SmolLM2-like, one token near certain
def test_token_stats_are_log_softmax_at_the_token_and_the_entropy(scale):
    """token_stats takes one exp pass over the vocabulary; what it records is log_softmax's value at the
    chosen token and the entropy -sum p log p, as computed the plain way, within float rounding."""
    from arbor_runtime.sampling import token_stats

    logits = torch.randn(5, 49152, generator=torch.Generator().manual_seed(0)) * scale
    tokens = torch.tensor([0, 7, 49151, 123, int(logits[4].argmax())])
    chosen, entropy = token_stats(logits, tokens)
    logp = torch.log_softmax(logits.double(), dim=-1)
    assert torch.allclose(chosen.double(), logp.gather(-1, tokens.view(-1, 1)).squeeze(-1), atol=1e-5, rtol=1e-6)
    assert torch.allclose(entropy.double(), -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=1e-6)
