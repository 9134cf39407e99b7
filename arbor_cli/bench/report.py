"""Rich tables and CSV / JSONL files for the benchmark outputs."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

REPLAY_COLUMNS = (
    ("policy", "policy", "{}"),
    ("budget_fraction", "budget", "{:g}"),
    ("budget_tokens", "budget tok", "{:,}"),
    ("top1_agreement", "top-1 agree", "{:.3f}"),
    ("mean_kl", "mean KL", "{:.2e}"),
    ("mean_dll", "mean ΔLL", "{:+.3f}"),
    ("peak_device_tokens", "peak KV tok", "{:,}"),
    ("peak_host_bytes", "peak host MB", "mb"),
    ("rehydrations", "rehydr.", "{:,}"),
    ("evicted_tokens", "evicted tok", "{:,}"),
    ("seconds", "seconds", "{:.2f}"),
)


def replay_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """One row per (policy, budget); an OOM run shows the replay step it stopped at (its
    fidelity covers the positions before it; see ``positions`` in the CSV)."""
    table = Table(title=title)
    for _, header, _ in REPLAY_COLUMNS:
        table.add_column(header, justify="left" if header == "policy" else "right")
    table.add_column("status")
    for row in rows:
        status = "ok"
        if row.get("oom"):
            status = f"[red]OOM[/red]@{row.get('replayed_steps')}"
        table.add_row(*(_cell(row.get(k), fmt) for k, _, fmt in REPLAY_COLUMNS), status)
    return table


def speed_table(summary: dict[str, Any], title: str) -> Table:
    """Median wall time, prefill tokens and forward calls per method, with ratios to the runtime."""
    table = Table(title=title)
    for header in (
        "method",
        "median s",
        "prefill tok",
        "forward calls",
        "runtime / method (time)",
        "(tokens)",
        "max |Δ logprob|",
    ):
        table.add_column(header, justify="left" if header == "method" else "right")
    for name, m in summary["methods"].items():
        ratio = summary["ratios"].get(f"runtime/{name}", {})
        diff = summary["max_logprob_diff"].get(f"runtime-{name}")
        table.add_row(
            name,
            f"{m['median_seconds']:.3f}",
            f"{m['prefill_tokens']:,}",
            f"{m['forward_calls']:,}",
            _cell(ratio.get("seconds"), "{:.3f}"),
            _cell(ratio.get("prefill_tokens"), "{:.3f}"),
            _cell(diff, "{:.1e}"),
        )
    over = summary["runtime_overhead"]
    table.caption = (
        f"runtime overhead (time in runtime calls outside model forwards): {_cell(over['fraction'], '{:.1%}')} "
        f"of {over['runtime_seconds']:.3f} s"
    )
    return table


def write_jsonl(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row, default=str) + "\n")
    return path


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Scalar columns only (lists and dicts, e.g. memory series, stay in the JSONL)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [k for k, v in row.items() if k not in fields and not isinstance(v, (list, dict))]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "mb":
        return f"{value / 2**20:.2f}"
    return fmt.format(value)
