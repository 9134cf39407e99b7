"""Quest's index over one block: per page, the per-channel min and max of its keys.

For a query q, no key k of a page can score more than

    sum_d max(q_d max_d, q_d min_d)  >=  q . k

(each channel's product is largest at one end of the page's range). Pages are fixed runs of
``page`` tokens inside the block (they never cross a block). Every page is scored (a flat scan,
two matmuls per layer); the top pages are read. min / max are stored in ``dtype`` rounded
outward, so the bound holds for what is stored.

With ``range_scale`` a < 1 a page scores ``q . m + a sum_d |q_d| h_d`` (m the range's middle, h its
half width; a = 1 is the bound above), an estimate that ranks wide pages lower.
"""

from __future__ import annotations

import torch

from arbor_runtime.sparse.chunking import page_starts
from arbor_runtime.sparse.tree import KeyReader


class PageIndex:
    """Per-page key ranges of one block, for every layer and KV head.

    Attributes:
        starts: (P + 1,) long page boundaries (block-local tokens).
        low / high: (L, H, P, D) per-channel min / max in the storage dtype.
        covered: (T,) bool, tokens the ranges include.
    """

    def __init__(self, page: int, dtype: torch.dtype, range_scale: float = 1.0) -> None:
        if not 0.0 <= range_scale <= 1.0:
            raise ValueError(f"range_scale={range_scale} must be in [0, 1]")
        self.page, self.dtype, self.range_scale = page, dtype, float(range_scale)
        self.starts = torch.zeros(1, dtype=torch.long)
        self.low: torch.Tensor | None = None
        self.high: torch.Tensor | None = None
        self.covered = torch.zeros(0, dtype=torch.bool)

    @classmethod
    def build(
        cls,
        page: int,
        dtype: torch.dtype,
        keys: KeyReader,
        layers: int,
        resident: torch.Tensor,
        length: int,
        range_scale: float = 1.0,
    ) -> PageIndex:
        """Index a block's resident tokens (T_res,) sorted block-local, ``length`` tokens in all."""
        index = cls(page, dtype, range_scale)
        index.update(keys, layers, resident, torch.zeros(length, dtype=torch.bool))
        return index

    @property
    def n_chunks(self) -> int:
        return self.starts.numel() - 1

    def update(self, keys: KeyReader, layers: int, resident: torch.Tensor, ends: torch.Tensor) -> bool:
        """Recompute the pages holding tokens the index has not seen (``ends``: (T,), only its length is used)."""
        length, old = int(ends.numel()), int(self.covered.numel())
        covered = torch.cat([self.covered, torch.zeros(length - old, dtype=torch.bool)])
        fresh = resident[~covered[resident]]
        if not fresh.numel() and length == old:
            return False
        n_old = self.n_chunks
        if length > old:  # the last page may grow; new pages follow
            tail = int(self.starts[-2]) if n_old else 0
            self.starts = torch.cat([self.starts[:-2], page_starts(length, self.page, start=tail)])
        pages = torch.unique(torch.searchsorted(self.starts, fresh, right=True) - 1)
        for p in pages.tolist():
            covered[int(self.starts[p]) : int(self.starts[p + 1])] = False
        page_of = torch.searchsorted(self.starts, resident, right=True) - 1
        mine = torch.isin(page_of, pages)
        covered[resident[mine]] = True
        self.covered = covered
        low, high = _ranges(keys, layers, resident[mine], page_of[mine], pages, self.dtype)
        if self.low is None:
            self.low = low.new_zeros(*low.shape[:2], 0, low.shape[-1])
            self.high = self.low.clone()
        grow = self.n_chunks - self.low.shape[2]
        if grow > 0:
            pad = self.low.new_zeros(*self.low.shape[:2], grow, self.low.shape[-1])
            self.low, self.high = torch.cat([self.low, pad], 2), torch.cat([self.high, pad], 2)
        self.low[:, :, pages], self.high[:, :, pages] = low, high
        return True

    def bounds(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """(r, H, P) page bound for queries q (r, H, g, D): max over the g heads of a group."""
        lo, hi = self.low[layer].float(), self.high[layer].float()  # (H, P, D)
        if self.range_scale == 0.0:  # q.m alone: one matmul
            return (torch.matmul(q, (lo + hi).transpose(-1, -2)) * 0.5).amax(2)
        if self.range_scale < 1.0:  # q.m + a sum_d |q_d| h_d
            a = self.range_scale
            lo, hi = (lo + hi) / 2 - a * (hi - lo) / 2, (lo + hi) / 2 + a * (hi - lo) / 2
        pos, neg = q.clamp(min=0), q.clamp(max=0)
        return (torch.matmul(pos, hi.transpose(-1, -2)) + torch.matmul(neg, lo.transpose(-1, -2))).amax(2)

    def scores(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """(r, H, P) every page's score (the flat scan)."""
        return self.bounds(layer, q)

    def retrieve(self, layer: int, q: torch.Tensor, n: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``n`` pages with the highest bound (a flat scan is exact): ids (r, H, m), bounds (r, H, m)."""
        scores = self.bounds(layer, q)
        best, pick = scores.topk(min(n, scores.shape[-1]), dim=-1)
        return pick, best

    @property
    def nbytes(self) -> int:
        """Bytes of the per-page key ranges (what the accelerator holds)."""
        return 0 if self.low is None else 2 * self.low.numel() * self.low.element_size()

    @property
    def host_bytes(self) -> int:
        """Bytes of the host-side bookkeeping (page boundaries, coverage mask)."""
        return self.starts.numel() * self.starts.element_size() + self.covered.numel()


def _ranges(keys: KeyReader, layers: int, tokens: torch.Tensor, page_of: torch.Tensor, pages: torch.Tensor, dtype):
    """Per-channel min / max of ``pages`` (n,) over ``tokens``: (L, H, n, D) each, rounded outward."""
    slot = torch.full((int(pages.max()) + 1 if pages.numel() else 1,), -1, dtype=torch.long)
    slot[pages] = torch.arange(pages.numel())
    local = slot[page_of]
    lows, highs = [], []
    for layer in range(layers):
        k = keys(layer, tokens).float()  # (H, n_tok, D)
        h, _, d = k.shape
        idx = local.view(1, -1, 1).expand(h, -1, d)
        lo = torch.full((h, pages.numel(), d), float("inf")).scatter_reduce_(1, idx, k, "amin", include_self=True)
        hi = torch.full((h, pages.numel(), d), float("-inf")).scatter_reduce_(1, idx, k, "amax", include_self=True)
        lows.append(_round(lo.nan_to_num(0.0, 0.0, 0.0), dtype, down=True))
        highs.append(_round(hi.nan_to_num(0.0, 0.0, 0.0), dtype, down=False))
    return torch.stack(lows), torch.stack(highs)


def _round(x: torch.Tensor, dtype: torch.dtype, down: bool) -> torch.Tensor:
    """``x`` in ``dtype``, rounded toward -inf (down) or +inf, so a stored range contains the true one."""
    y = x.to(dtype)
    if y.dtype == x.dtype:
        return y
    wrong = y.float() > x if down else y.float() < x
    away = torch.full_like(y, float("-inf") if down else float("inf"))
    return torch.where(wrong, torch.nextafter(y, away), y)
