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


def test_greedy_tokens_are_argmax_first_maximum_included():
    """The greedy draw (numpy's argmax on CPU) picks argmax's token: the first of tied maxima, in float32,
    bfloat16 (widened first) and under a grammar's -inf mask."""
    from arbor_runtime.sampling import greedy_tokens

    g = torch.Generator().manual_seed(1)
    ties = torch.randint(0, 4, (16, 300), generator=g).float()  # many tied maxima per row
    masked = torch.randn(4, 49152, generator=g).masked_fill(torch.rand(4, 49152, generator=g) < 0.9, float("-inf"))
    for scores in (ties, ties.bfloat16(), masked, torch.randn(3, 49152, generator=g).bfloat16()):
        picks = greedy_tokens(scores)
        assert picks.dtype == torch.long
        assert torch.equal(picks, scores.argmax(dim=-1))


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_rows_draw_and_statistics_are_bit_identical_whatever_rows_share_its_batch(temperature):
    """On CPU draw_rows draws each row alone: a row's token, log-prob and entropy are bit-identical
    whether it is drawn alone, first, last or in the middle of batches of 2, 5 and 8 rows (a reduction over
    a whole (B, V) batch may round differently from one over a single row); the draw reads the masked
    scores, the statistics the raw logits."""
    from arbor_runtime.sampling import SamplingParams, draw_rows

    params = SamplingParams(temperature=temperature, top_k=50 if temperature else 0)
    logits = torch.randn(8, 49152, generator=torch.Generator().manual_seed(3)) * 4
    scores = logits.clone()
    scores[:, :100] = float("-inf")  # a grammar's mask: the draw reads it, the statistics do not

    def draw(rows):
        return draw_rows(logits[rows], scores[rows], params, [torch.Generator().manual_seed(i) for i in rows])

    alone = [draw([i]) for i in range(8)]
    for batch in ([0, 1], [4, 0, 2, 7, 6], [7, 6, 5, 4, 3, 2, 1, 0]):
        tokens, logprobs, entropies = draw(batch)
        for k, i in enumerate(batch):
            assert int(tokens[k]) >= 100
            got = (tokens[k], logprobs[k], entropies[k])
            assert all(torch.equal(a, b[0]) for a, b in zip(got, alone[i], strict=True)), (batch, i)
