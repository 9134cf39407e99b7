"""Quest (Tang et al. 2024, arXiv 2406.10774): fixed pages, per-channel key min / max, decode
queries read the pages with the highest bound sum_d max(q_d max_d, q_d min_d) (plus sinks and
a recent window). The baseline for ``lychee``; wraps a memory policy (see ``sparse.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.sparse import SparsePolicy
from arbor_runtime.sparse import PageIndex


@dataclass(slots=True)
class QuestPolicy(SparsePolicy):
    """Quest sparse decode attention.

    Attributes:
        page_tokens: tokens per page (pages never cross a block).
        token_share: as :class:`SparsePolicy`; 0.25 here (past ``dense_below``): of the shares the
            RULER-style suite measured at 8K (10, 25, 50%), a quarter and a half tie on agreement with
            dense x speed, and half decodes at about dense's speed (docs/data/longctx/, issue 49).
    """

    name = "quest"

    page_tokens: int = 16
    token_share: float = 0.25

    def __post_init__(self) -> None:
        SparsePolicy.__post_init__(self)
        if not isinstance(self.page_tokens, int) or self.page_tokens < 1:
            raise ValueError(f"page_tokens={self.page_tokens!r} must be a positive integer")

    def index_builder(self):
        page, scale = self.page_tokens, float(self.bound_scale)

        def build(keys, layers, resident, ends):
            return PageIndex.build(page, torch.float16, keys, layers, resident, int(ends.numel()), scale)

        return build, page
