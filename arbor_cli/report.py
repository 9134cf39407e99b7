"""Rich tables that fit the terminal: results of a run, sweep summaries, replay fidelity.

Every field of a row stays in the JSON lines and CSV files; a table shows what fits. Columns are
dropped one at a time, highest ``rank`` first, until the rest fits the width (text columns such as
the question are cut with "…" first); if not even the rank-0 columns fit, each row becomes a small
two-column block (field, value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table

from arbor_cli.results import Column, format_cell

#: the per-problem table of ``arbor-solve`` (rank 0 always shown; higher ranks go first when narrow)
RESULT_COLUMNS = (
    Column("index", "problem", label=True),
    Column("question", "question", label=True, rank=4),
    Column("solved", "solved"),
    Column("steps", "steps", rank=3),
    Column("prefill_tokens", "prefill tok", "{:,}", rank=5),
    Column("decode_tokens", "decode tok", "{:,}", rank=5),
    Column("peak_device_tokens", "peak KV tok", "{:,}", rank=1),
    Column("peak_device_bytes", "peak KV MB", "mb", rank=6),
    Column("peak_host_bytes", "peak host MB", "mb", rank=3),
    Column("rehydrations", "rehydr.", "{:,}", rank=2),
    Column("evicted_tokens", "evicted tok", "{:,}", rank=3),
    Column("seconds", "seconds", "{:.1f}", rank=1),
    Column("note", "note", label=True, rank=1),
)
#: text columns cut with "…" before any column is dropped, never below this many characters
MIN_TEXT = 16
#: a rich table's own characters: a border left of every column and one at the end; padding 1 + 1
BORDER, PADDING = 1, 2


def results_table(rows: Sequence[dict[str, Any]], title: str, width: int = 80) -> Table | Group:
    """One row per problem plus a totals row, fitted to ``width`` columns."""
    shown = [row | {"note": _note(row)} for row in rows]
    return fit_table(shown, RESULT_COLUMNS, title, width, totals=_totals(rows) if rows else None)


def fit_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    title: str,
    width: int = 80,
    totals: dict[str, Any] | None = None,
) -> Table | Group:
    """``rows`` as a rich table no wider than ``width`` (see the module docstring)."""
    cells = [[format_cell(row.get(c.key), c.fmt) for c in columns] for row in [*rows, *([totals] if totals else [])]]
    widths = [max([len(c.header), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    keep = _fit(columns, widths, width)
    if keep is None:
        return _vertical(rows, columns, title)
    table = Table(title=title)
    for i in keep:
        table.add_column(columns[i].header, justify="left" if columns[i].label else "right", no_wrap=True)
    room = _room(columns, widths, keep, width)
    for n, row in enumerate(cells):
        if totals and n == len(rows):
            table.add_section()
        table.add_row(*(_cut(row[i], room[i]) for i in keep))
    return table


def _fit(columns: Sequence[Column], widths: list[int], width: int) -> list[int] | None:
    """Indices of the columns that fit (in table order), dropping one column at a time: the highest
    rank first, the rightmost among equal ranks. None when the rank-0 columns alone do not fit."""
    keep = list(range(len(columns)))
    while _width(columns, widths, keep, squeeze=True) > width:
        drop = max(keep, key=lambda i: (columns[i].rank, i))
        if columns[drop].rank == 0:
            return None
        keep.remove(drop)
    return keep


def _width(columns: Sequence[Column], widths: list[int], keep: list[int], squeeze: bool) -> int:
    sizes = [min(widths[i], max(MIN_TEXT, len(columns[i].header))) if squeeze and columns[i].label else widths[i]
             for i in keep]  # fmt: skip
    return sum(sizes) + (BORDER + PADDING) * len(keep) + BORDER


def _room(columns: Sequence[Column], widths: list[int], keep: list[int], width: int) -> dict[int, int]:
    """Width per kept column: numbers at their natural width, text columns share what is left."""
    room = {i: widths[i] for i in keep}
    over = _width(columns, widths, keep, squeeze=False) - width
    for i in sorted((i for i in keep if columns[i].label), key=lambda i: -widths[i]):
        if over <= 0:
            break
        floor = max(MIN_TEXT, len(columns[i].header))
        cut = min(over, max(room[i] - floor, 0))
        room[i] -= cut
        over -= cut
    return room


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: max(room - 1, 0)] + "…"


def _vertical(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str) -> Group:
    """One two-column block (field, value) per row, for terminals too narrow for any table."""
    blocks = []
    for row in rows:
        block = Table(show_header=False, box=None, padding=(0, 1, 0, 0))
        block.add_column(style="bold", no_wrap=True, min_width=max(len(c.header) for c in columns))
        block.add_column(overflow="fold")
        for c in columns:
            block.add_row(c.header, format_cell(row.get(c.key), c.fmt))
        blocks.append(block)
    return Group(title, *blocks)


def _note(row: dict[str, Any]) -> str:
    if row.get("oom"):
        return "OOM"
    return row.get("error") or (row.get("answer") or "")


def _totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def total(key: str) -> int:
        return sum(r.get(key) or 0 for r in rows)

    def peak(key: str) -> int:
        return max(r.get(key) or 0 for r in rows)

    solved = sum(bool(r.get("solved")) for r in rows)
    return {
        "index": "all", "question": f"{len(rows)} problems", "solved": f"{solved}/{len(rows)}",
        "prefill_tokens": total("prefill_tokens"), "decode_tokens": total("decode_tokens"),
        "peak_device_tokens": peak("peak_device_tokens"), "peak_device_bytes": peak("peak_device_bytes"),
        "peak_host_bytes": peak("peak_host_bytes"), "rehydrations": total("rehydrations"),
        "evicted_tokens": total("evicted_tokens"), "seconds": sum(r.get("seconds") or 0 for r in rows),
        "note": f"OOM: {sum(bool(r.get('oom')) for r in rows)}",
    }  # fmt: skip
