"""Rich tables for the benchmark outputs (files are written by :mod:`arbor_cli.results`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table

from arbor_cli.report import fit_table
from arbor_cli.results import Column, format_cell

REPLAY_COLUMNS = (
    Column("policy", "policy", label=True),
    Column("budget_fraction", "budget", "{:g}"),
    Column("budget_tokens", "budget tok", "{:,}", rank=2),
    Column("top1_agreement", "top-1 agree", "{:.3f}"),
    Column("mean_kl", "mean KL", "{:.2e}", rank=1),
    Column("mean_dll", "mean ΔLL", "{:+.3f}", rank=2),
    Column("peak_device_tokens", "peak KV tok", "{:,}"),
    Column("peak_host_bytes", "peak host MB", "mb", rank=2),
    Column("rehydrations", "rehydr.", "{:,}", rank=1),
    Column("evicted_tokens", "evicted tok", "{:,}", rank=3),
    Column("seconds", "seconds", "{:.2f}", rank=3),
    Column("status", "status", label=True),
)


def replay_table(rows: Sequence[dict[str, Any]], title: str, width: int = 80) -> Table | Group:
    """One row per (policy, budget); an OOM run shows the replay step it stopped at (its
    fidelity covers the positions before it; see ``positions`` in the CSV)."""
    shown = [row | {"status": f"OOM@{row.get('replayed_steps')}" if row.get("oom") else "ok"} for row in rows]
    return fit_table(shown, REPLAY_COLUMNS, title, width)


SPEED_COLUMNS = (
    Column("method", "method", label=True),
    Column("median_seconds", "median s", "{:.3f}"),
    Column("prefill_tokens", "prefill tok", "{:,}"),
    Column("forward_calls", "forward calls", "{:,}", rank=1),
    Column("ratio_seconds", "runtime/method time", "{:.3f}"),
    Column("ratio_tokens", "(tokens)", "{:.3f}"),
    Column("diff", "max |Δ logprob|", "{:.1e}", rank=1),
)


def speed_table(summary: dict[str, Any], title: str, width: int = 80) -> Table | Group:
    """Median wall time, prefill tokens and forward calls per method, with ratios to the runtime."""
    rows = []
    for name, m in summary["methods"].items():
        ratio = summary["ratios"].get(f"runtime/{name}", {})
        rows.append(
            {"method": name, "median_seconds": m["median_seconds"], "prefill_tokens": m["prefill_tokens"],
             "forward_calls": m["forward_calls"], "ratio_seconds": ratio.get("seconds"),
             "ratio_tokens": ratio.get("prefill_tokens"), "diff": summary["max_logprob_diff"].get(f"runtime-{name}")}
        )  # fmt: skip
    table = fit_table(rows, SPEED_COLUMNS, title, width)
    over = summary["runtime_overhead"]
    caption = (
        f"runtime overhead (time in runtime calls outside model forwards): {format_cell(over['fraction'], '{:.1%}')} "
        f"of {over['runtime_seconds']:.3f} s"
    )
    if isinstance(table, Table):
        table.caption = caption
        return table
    return Group(table, caption)
