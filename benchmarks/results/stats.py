"""Interval estimates for the rates a results table reports (solve rate, OOM rate) and for means over
problems (a per-tree fidelity: Student's t)."""

from __future__ import annotations

import math


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval for ``successes`` out of ``n`` (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and is not zero-width at 0/n or n/n,
    which matters for the small n (6, 20 puzzles) these tables have. ``n == 0`` gives (0, 1).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson: need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return 0.0, 1.0
    if successes in (0, n):  # closed form at the edges (the general one leaves a rounding residue)
        bound = n / (n + z * z)
        return (0.0, 1 - bound) if successes == 0 else (bound, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def format_rate(successes: int, n: int) -> str:
    """``k/n`` with the rate and its 95% Wilson interval, e.g. ``1/6 17% [3-56%]``."""
    lo, hi = wilson(successes, n)
    rate = successes / n if n else 0.0
    return f"{successes}/{n} {100 * rate:.0f}% [{100 * lo:.0f}-{100 * hi:.0f}%]"


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the 95% Wilson intervals of two ``(successes, n)`` rates overlap (no evidence of a difference)."""
    (lo_a, hi_a), (lo_b, hi_b) = wilson(*a), wilson(*b)
    return lo_a <= hi_b and lo_b <= hi_a


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact p-value that two methods run on the same problems solve equally often (McNemar's
    exact test): ``gained`` problems only the first solves, ``lost`` only the second; problems both or
    neither solve say nothing. 1.0 when no problem differs."""
    if gained < 0 or lost < 0:
        raise ValueError(f"sign_test: need counts >= 0, got {gained}, {lost}")
    n = gained + lost
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


#: two-sided 95% quantiles of Student's t by degrees of freedom (1..30); above 30 the normal's 1.96
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean of ``values`` and its 95% Student-t interval (one value: the mean
    three times; none: ValueError). For per-problem figures averaged over a handful of problems."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval: no values")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half
