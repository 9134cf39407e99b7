"""Rich rendering of run results (tables, best paths)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

COLUMNS = (
    ("index", "problem", "{}"),
    ("question", "question", "{}"),
    ("solved", "solved", "{}"),
    ("steps", "steps", "{}"),
    ("prefill_tokens", "prefill tok", "{:,}"),
    ("decode_tokens", "decode tok", "{:,}"),
    ("peak_device_tokens", "peak KV tok", "{:,}"),
    ("peak_device_bytes", "peak KV MB", "mb"),
    ("peak_host_bytes", "peak host MB", "mb"),
    ("rehydrations", "rehydr.", "{:,}"),
    ("evicted_tokens", "evicted tok", "{:,}"),
    ("seconds", "seconds", "{:.1f}"),
)


def results_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """One row per problem plus a totals row."""
    table = Table(title=title)
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right" if header not in ("question",) else "left")
    table.add_column("note")
    for row in rows:
        table.add_row(*(_cell(row.get(key), fmt) for key, _, fmt in COLUMNS), _note(row))
    if rows:
        table.add_section()
        table.add_row(*_totals(rows))
    return table


def _note(row: dict[str, Any]) -> str:
    if row.get("oom"):
        return "[red]OOM[/red]"
    return row.get("error") or (row.get("answer") or "")


def _totals(rows: Sequence[dict[str, Any]]) -> list[str]:
    solved = sum(bool(r.get("solved")) for r in rows)
    cells = ["all", f"{len(rows)} problems", f"{solved}/{len(rows)}", ""]
    cells += [f"{sum(r.get(k) or 0 for r in rows):,}" for k in ("prefill_tokens", "decode_tokens")]
    cells += [f"{max(r.get('peak_device_tokens') or 0 for r in rows):,}"]
    cells += [_cell(max(r.get("peak_device_bytes") or 0 for r in rows), "mb")]
    cells += [_cell(max(r.get("peak_host_bytes") or 0 for r in rows), "mb")]
    cells += [f"{sum(r.get(k) or 0 for r in rows):,}" for k in ("rehydrations", "evicted_tokens")]
    cells += [f"{sum(r.get('seconds') or 0 for r in rows):.1f}", f"OOM: {sum(bool(r.get('oom')) for r in rows)}"]
    return cells


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "mb":
        return f"{value / 2**20:.1f}"
    if isinstance(value, bool):
        return "[green]yes[/green]" if value else "no"
    return fmt.format(value)
