"""benchmarks/pieces.py end to end on small inputs: the packed read and the in-place read of a
block's pieces build the same search tree as full, and the step bench reports every cell."""

from __future__ import annotations

import pytest
from floats import reassociation_tol

from arbor_runtime.attention import tree as tree_attention
from benchmarks.pieces import micro_rows, scattered, search_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_scattered_pieces_cover_the_block_in_order_with_gaps_between_them():
    pieces = scattered(100, 7)
    assert [int(i) for p in pieces for i in p.idx] == list(range(100))
    assert all(b.start > a.start + a.length for a, b in zip(pieces, pieces[1:], strict=False))


def test_step_bench_reports_each_piece_count_with_and_without_statistics():
    rows = micro_rows(tokens=96, counts=[1, 6], rows=2, repeats=1)
    assert [(r["pieces"], r["stats"]) for r in rows] == [(1, False), (1, True), (6, False), (6, True)]
    assert all(r["in_place_ms"] > 0 and r["packed_ms"] > 0 for r in rows)
    assert tree_attention.PACK_BELOW_TOKENS == 512  # put back


def test_arbor_under_a_budget_rebuilds_fulls_tree_with_pieces_packed_and_in_place(data_dir, tiny):
    overrides = ["model=tiny-random", f"paths.data_dir={data_dir}", "task=gsm8k", "task.start=0", "task.end=1"]
    overrides += ["task.max_thought_tokens=16", "controller=best_first", "controller.n_generate=2"]
    overrides += ["controller.max_expansions=12", "controller.vote_quorum=0", "controller.release_pruned=false"]
    rows = search_rows(overrides, "arbor", [0.6])
    full, packed, in_place = rows
    assert (full["policy"], packed["packed"], in_place["packed"]) == ("full", True, False)
    assert packed["budget"] == in_place["budget"] < full["peak_device_tokens"]
    assert packed["same_tree"], packed  # one copy per block, as full reads its contiguous blocks
    # in place, a block in many pieces is read piece by piece and merged: the sums run in another order,
    # so on the tiny model's near-uniform distributions a sampled token may flip where rounding moves it;
    # up to there every shared node's log-probs agree within reassociation (tests/floats.py)
    assert in_place["same_tree"] or in_place["max_logprob_gap"] <= reassociation_tol(tiny, [20.0]), in_place
    for run in (packed, in_place):
        assert not run["oom"] and run["peak_device_tokens"] <= run["budget"]
    assert packed["rehydrations"] > 0  # the budget bound: blocks left and came back
