"""Float tolerances the code can promise, derived from the dtype and the size of the values.

Two computations of the same log-probabilities are bit-identical only when they run the same kernels
on the same shapes (then tests compare with ``==``). Batched decode against one teacher-forced
prefill, a whole-path forward against an incremental one, or another thread count change the order
of the floating-point sums; the results then differ by rounding, not by a bug. Rounding of a sum of
n products is bounded by about ``n * eps`` relative to the size of the terms (Higham's gamma_n), so
the tolerance is that bound for the longest reduction feeding a logit (the hidden size), scaled by
the largest magnitude compared. It does not depend on the machine or the thread count.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from arbor_runtime import LoadedModel


def reassociation_tol(loaded: LoadedModel, values: Iterable[float]) -> float:
    """Largest |a - b| between two evaluations of ``values`` (log-probs) that differ only in summation order."""
    eps = torch.finfo(next(loaded.model.parameters()).dtype).eps
    magnitude = max((abs(v) for v in values), default=1.0)
    return int(loaded.model.config.hidden_size) * eps * max(1.0, magnitude)
