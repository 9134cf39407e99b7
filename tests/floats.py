"""Float tolerances the code can promise, derived from the dtype and the measured rounding gap.

Two computations of the same log-probabilities are bit-identical only when they run the same kernels
on the same shapes (then tests compare with ``==``). Batched decode against one teacher-forced
prefill, a whole-path forward against an incremental one, or another thread count change the order
of the floating-point sums; the results then differ by rounding, not by a bug.

A priori, rounding of a sum of n products is bounded by about ``n * eps`` of the terms (Higham's
gamma_n, n = the hidden size), which for SmolLM2 (n = 576) allowed ~1e-3 at |log-prob| 13: 30-90x
the gaps measured. The tolerance is therefore the measured gap, in units of the dtype's eps, with
headroom. A log-prob is a logit minus a log-sum-exp of logits, so its rounding has a part set by the
logits' size whatever the log-prob (``FLOOR_EPS``) and a part that grows with the log-prob's size
(``SLOPE_EPS`` per unit of |log-prob|).

Measured (float32, CPU, OMP_NUM_THREADS=1 and =2 alike; every comparison that calls
:func:`reassociation_tol` in test_choose, test_trace_replay, test_calibration, test_bench and
test_branched_exactness, both models, recorded with the gap and the magnitude passed in):
- at |log-prob| <= 3 the largest gap is 1.7e-5 = 143 eps (tiny-random, a branched tree's block
  log-probs against one plain forward; SmolLM2's largest there 7.3e-6 = 61 eps);
- the largest at a large magnitude is 1.41e-4 = 1184 eps at |log-prob| 41.2 (tiny-random, whole
  vocabulary, arbor at a low budget against full in test_trace_replay), then 9.6e-5 at 27.4 (three
  builds in test_bench); SmolLM2's largest 4.8e-5 at 44.8 (whole vocabulary, branched tree);
- docs/results.md "Smallest exact budget" reports SmolLM2 gaps up to 3.3e-5 on live searches.
Every measured gap lies under ``eps * (150 + 26 * |log-prob|)`` (the closest at 0.97 of it);
the tolerance is ``HEADROOM`` times that: SmolLM2 at |log-prob| 13 gets 1.7e-4 (was 8.8e-4).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from arbor_runtime import LoadedModel

#: measured rounding gap of a log-prob, in eps: the part independent of its size, and per unit of |log-prob|
FLOOR_EPS, SLOPE_EPS = 150, 26
#: headroom over the largest measured gap (other prompts, kernels, machines)
HEADROOM = 3


def reassociation_tol(loaded: LoadedModel, values: Iterable[float]) -> float:
    """Largest |a - b| between two evaluations of ``values`` (log-probs) that differ only in summation order."""
    eps = torch.finfo(next(loaded.model.parameters()).dtype).eps
    magnitude = max((abs(v) for v in values), default=1.0)
    return HEADROOM * eps * (FLOOR_EPS + SLOPE_EPS * max(1.0, magnitude))
