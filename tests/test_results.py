"""Result files and tables: one cell formatter, one CSV writer, markdown, and tables that fit 80 columns."""

from __future__ import annotations

import csv
import math

import pytest
from rich.console import Console

from arbor_cli.report import RESULT_COLUMNS, fit_table, results_table
from arbor_cli.results import Column, format_cell, markdown_table, write_csv
from arbor_cli.sweep import summary_table
from benchmarks.report import replay_table


def row(index: int, **fields) -> dict:
    """A results row as arbor-solve writes it (long question and answer, every counter set)."""
    return {
        "index": index, "question": "Natalia sold clips to 48 of her friends in April, and then half as many",
        "solved": index % 2 == 0, "steps": 3, "prefill_tokens": 1_234_567, "decode_tokens": 98_765,
        "peak_device_tokens": 123_456, "peak_device_bytes": 5_678_901_234, "peak_host_bytes": 1_234_567_890,
        "rehydrations": 12_345, "evicted_tokens": 654_321, "seconds": 1234.5, "oom": False, "error": None,
        "answer": "(6 - 4) * (4 + 8) and a long tail of words", "trace": [1, 2],
    } | fields  # fmt: skip


def rendered(table, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    return console.export_text().splitlines()


@pytest.mark.parametrize(
    ("value", "fmt", "text"),
    [
        (None, "{:,}", "-"),
        (math.nan, "{:.2f}", "-"),
        (True, "{}", "yes"),
        ("False", "auto", "no"),
        (1234567, "{:,}", "1,234,567"),
        (3 * 2**20, "mb", "3.00"),
        (123 * 2**20, "mb", "123.0"),
        (0.456, "%", "46%"),
        (1234.0, "auto", "1,234"),
        ("0.000123456", "auto", "0.0001235"),
        ("bfs", "auto", "bfs"),
        (0.5, "{:+.3f}", "+0.500"),
    ],
)
def test_format_cell(value, fmt, text):
    assert format_cell(value, fmt) == text


def test_csv_keeps_every_scalar_field_in_order(tmp_path):
    rows = [{"b": 1, "a": [1], "c": "x"}, {"d": 2.5, "b": 2}]
    path = write_csv(tmp_path / "r.csv", rows, first=("d",))
    with path.open() as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0]) == ["d", "b", "c"] and table[1] == {"d": "2.5", "b": "2", "c": ""}


def test_markdown_escapes_pipes_and_aligns_numbers():
    columns = [Column("name", "name", label=True), Column("n", "n", "{:,}")]
    md = markdown_table([{"name": "a|b", "n": 1000}], columns)
    assert md.splitlines() == ["| name | n |", "|---|---:|", "| a\\|b | 1,000 |"]


@pytest.mark.parametrize("width", [80, 100])
def test_results_table_fits_the_terminal(width):
    rows = [row(900), row(901, oom=True), row(902, solved=None)]
    lines = rendered(results_table(rows, title="game24 · bfs · arbor", width=width), width)
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    for needed in ("problem", "solved", "peak KV tok", "seconds", "123,456", "1234.5", "OOM", "all", "1/3"):
        assert needed in text, needed
    assert "1,…" not in text and "12…" not in text  # numbers are never squeezed


def test_wide_terminals_show_every_column():
    lines = rendered(results_table([row(900)], title="t", width=250), 250)
    header = next(line for line in lines if "problem" in line)
    assert all(c.header in header for c in RESULT_COLUMNS)
    assert "Natalia sold clips to 48 of her friends in April" in "\n".join(lines)


def test_narrow_terminals_keep_the_rank_0_columns_then_go_vertical():
    lines = rendered(results_table([row(900)], title="t", width=30), 30)
    assert max(len(line) for line in lines) <= 30 and "problem" in lines[2] and "solved" in lines[2]
    lines = rendered(results_table([row(900)], title="t", width=19), 19)  # no table fits: field / value blocks
    assert any(line.startswith("peak KV tok") for line in lines) and max(len(line) for line in lines) <= 19


def test_sweep_and_replay_tables_fit_80_columns():
    summary = [
        {"task": "game24", "controller": "best_first", "policy": "streaming", "budget": "0.6x",
         "variant": "controller.n_generate=3", "problems": 100, "solved_rate": 0.25, "seconds_mean": 123.45,
         "seconds_p50": 120.5, "seconds_p95": 300.25, "peak_device_tokens": 12_345, "peak_host_bytes": 2**30,
         "rehydrations": 12_345, "oom_rate": 0.1}
    ]  # fmt: skip
    replay = [
        {"policy": "streaming", "budget_fraction": 0.3, "budget_tokens": 12_345, "top1_agreement": 0.987,
         "mean_kl": 1.2e-3, "mean_dll": -0.123, "peak_device_tokens": 12_345, "peak_host_bytes": 2**25,
         "rehydrations": 1234, "evicted_tokens": 54_321, "seconds": 12.34, "oom": True, "replayed_steps": 17}
    ]  # fmt: skip
    for table in (summary_table(summary, "sweep", width=80), replay_table(replay, "replay", width=80)):
        lines = rendered(table, 80)
        assert max(len(line) for line in lines) <= 80 and "…" not in "\n".join(lines)
    assert "OOM@17" in "\n".join(rendered(replay_table(replay, "replay", width=80), 80))


def test_fit_table_drops_high_ranks_first():
    columns = [Column("a", "a"), Column("b", "bbbbbbbbbbbb", rank=2), Column("c", "cccccccccccc", rank=1)]
    lines = rendered(fit_table([{"a": 1, "b": 2, "c": 3}], columns, "t", width=24), 24)
    text = "\n".join(lines)
    assert "cccccccccccc" in text and "bbbbbbbbbbbb" not in text
