"""Interval estimates for the rates a results table reports (solve rate, OOM rate)."""

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
