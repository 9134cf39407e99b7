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


class RowPartials:
    """Running per-row attention (out, lse) that many partials over subsets of the rows merge into, a
    buffer of them at a time (one scatter merge for many key sets instead of one merge per key set).

    A partial covers some rows (a context block read by the rows whose path holds it); it is copied
    into a buffer of ``capacity`` row entries, and when the buffer is full (and at :meth:`result`) all
    of them are merged into the rows at once: per row, the log-sum-exp over its running value and its
    buffered entries, and the outputs weighted by it. The same sums as :func:`merge_partials` applied
    one partial at a time, in another order (equal up to float rounding).

    Args:
        out: (R, H, M, D) float32 running outputs; lse: (R, H, M) float32 running log-sum-exps.
        capacity: buffered row entries at most (scratch: ``capacity`` x H x M x (D + 1) floats).
    """

    def __init__(self, out: torch.Tensor, lse: torch.Tensor, capacity: int) -> None:
        self.out, self.lse = out.float(), lse.float()
        self.capacity = max(int(capacity), 1)
        self._o: torch.Tensor | None = None  # (capacity, H, M, D), allocated at the first partial
        self._s: torch.Tensor | None = None  # (capacity, H, M)
        self._rows: list[torch.Tensor] = []
        self._n = 0

    def add(self, rows: torch.Tensor | None, o: torch.Tensor, s: torch.Tensor) -> None:
        """One partial: ``rows`` (r,) long batch rows (None: every row, in order), ``o`` (r, H, M, D) and
        ``s`` (r, H, M) (any strides)."""
        if rows is None:  # every row at once: merged in place of the running values
            self.flush()
            self.out, self.lse = merge_partials(self.out, self.lse, o, s)
            return
        r = int(rows.numel())
        if r > self.capacity:
            self.flush()
            mo, ms = merge_partials(self.out.index_select(0, rows), self.lse.index_select(0, rows), o, s)
            self.out, self.lse = self.out.index_copy(0, rows, mo), self.lse.index_copy(0, rows, ms)
            return
        if self._n + r > self.capacity:
            self.flush()
        if self._o is None:
            self._o = self.out.new_empty((self.capacity, *self.out.shape[1:]))
            self._s = self.lse.new_empty((self.capacity, *self.lse.shape[1:]))
        self._o[self._n : self._n + r].copy_(o)
        self._s[self._n : self._n + r].copy_(s)
        self._rows.append(rows)
        self._n += r

    def flush(self) -> None:
        """Merge the buffered entries into their rows."""
        if not self._n:
            return
        n, idx = self._n, torch.cat(self._rows) if len(self._rows) > 1 else self._rows[0]
        o, s = self._o[:n], self._s[:n]
        at = idx.view(-1, *([1] * (s.dim() - 1))).expand_as(s)
        top = self.lse.clone().scatter_reduce_(0, at, s, "amax")  # (R, H, M): each row's largest lse
        w_old = torch.exp(self.lse - top).nan_to_num_(0.0)  # a row that saw nothing yet: -inf - -inf
        w_new = torch.exp(s - top.index_select(0, idx)).nan_to_num_(0.0)
        den = w_old.index_add(0, idx, w_new)  # >= 1 wherever a row saw a key, 0 where it saw none
        num = (self.out * w_old.unsqueeze(-1)).index_add_(0, idx, o * w_new.unsqueeze(-1))
        den = den.clamp_min_(1.0)  # the largest entry weighs exp(0) = 1: only a row that saw nothing changes
        self.out = num.div_(den.unsqueeze(-1))
        self.lse = top.add_(den.log_())
        self._rows, self._n = [], 0

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out (R, H, M, D), lse (R, H, M)) float32 over every partial added."""
        self.flush()
        return self.out, self.lse
