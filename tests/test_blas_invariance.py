"""The suite's premise (tests/conftest.py sets MKL_CBWR): a row's matrix product does not depend on
how many rows share the call, so trees built under different batchings can be compared token for token."""

from __future__ import annotations

import os

from benchmarks.blas_invariance import measure


def test_a_rows_product_is_the_same_bits_in_any_batch(one_torch_thread):
    assert os.environ.get("MKL_CBWR") == "AVX2,STRICT"
    got = measure([1, 2, 3, 5, 8], repeats=0)
    assert got["diff"] == {1: 0.0, 2: 0.0, 3: 0.0, 5: 0.0, 8: 0.0}
    assert all(ms > 0 for ms in got["ms"].values())
