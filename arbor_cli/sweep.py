"""Merge a Hydra sweep (``arbor-solve -m ...``): every job's results, tagged with its overrides, in one table.

Each job directory under the sweep dir holds ``results.jsonl`` and ``.hydra/`` (``overrides.yaml``,
``hydra.yaml`` with the config-group choices, ``config.yaml``). :func:`merge` writes
``merged.csv`` (one row per problem per job) and ``merged.md`` (the summary as a markdown table,
for docs), and returns the summary rows grouped by (task, controller, policy, budget, variant);
*variant* holds the job's other overrides whose values differ between jobs, so sweeping e.g.
``controller.n_generate=3,5`` does not pool the two settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Group
from rich.table import Table

from arbor_cli.report import fit_table
from arbor_cli.results import RESULTS_FILE, Column, load_done, write_csv
from arbor_cli.results import markdown_table as _markdown

MERGED_CSV, MERGED_MD = "merged.csv", "merged.md"
GROUP_KEYS = ("task", "controller", "verifier", "policy", "budget", "variant")
#: overrides already covered by a group key (never part of ``variant``)
GROUPED_OVERRIDES = {"task", "controller", "policy", "policy.budget_tokens", "policy.budget_ratio"}
#: summary columns (a narrow terminal drops the highest ranks first; files keep them all)
SUMMARY_COLUMNS = (
    Column("task", "task", label=True),
    Column("controller", "controller", label=True),
    Column("verifier", "verifier", label=True, rank=1),
    Column("policy", "policy", label=True),
    Column("budget", "budget", label=True),
    Column("variant", "variant", label=True, rank=1),
    Column("problems", "problems", rank=2),
    Column("solved_rate", "solved", "%"),
    Column("seconds_mean", "mean s", "{:.2f}", rank=3),
    Column("seconds_p50", "p50 s", "{:.2f}", rank=1),
    Column("seconds_p95", "p95 s", "{:.2f}", rank=2),
    Column("peak_device_tokens", "peak KV tok", "{:,}"),
    Column("peak_host_bytes", "peak host MB", "mb", rank=2),
    Column("rehydrations", "rehydrations", "{:,}", rank=1),
    Column("oom_rate", "OOM", "%"),
)


@dataclass(slots=True)
class Job:
    """One job of a sweep: its directory (relative name) and the tags its rows get."""

    name: str
    path: Path
    overrides: dict[str, str] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    budget: str | None = None


@dataclass(slots=True)
class Merged:
    """What :func:`merge` produced."""

    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    csv_path: Path
    md_path: Path


def merge(sweep_dir: Path, out_dir: Path | None = None) -> Merged:
    """Read every job under ``sweep_dir``; write ``merged.csv`` and ``merged.md`` to ``out_dir`` (default: there)."""
    sweep_dir = Path(sweep_dir)
    jobs = find_jobs(sweep_dir)
    if not jobs:
        raise FileNotFoundError(f"no {RESULTS_FILE} under sweep dir {str(sweep_dir)!r}")
    rows = merged_rows(jobs)
    summary = summarize(rows)
    out = Path(out_dir) if out_dir is not None else sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / MERGED_CSV, out / MERGED_MD
    write_csv(csv_path, rows, first=("job", *GROUP_KEYS, "overrides", "index"))
    md_path.write_text(markdown_table(summary, drop_empty=("variant", "verifier")))
    return Merged(rows, summary, csv_path, md_path)


def find_jobs(sweep_dir: Path) -> list[Job]:
    """Every directory under ``sweep_dir`` holding a ``results.jsonl``, with its Hydra metadata."""
    jobs = []
    for results in sorted(Path(sweep_dir).rglob(RESULTS_FILE)):
        path = results.parent
        hydra_dir = path / ".hydra"
        overrides = _read_yaml(hydra_dir / "overrides.yaml") or []
        choices = ((_read_yaml(hydra_dir / "hydra.yaml") or {}).get("hydra", {}).get("runtime", {})).get("choices", {})
        policy = (_read_yaml(hydra_dir / "config.yaml") or {}).get("policy", {})
        jobs.append(
            Job(
                name=str(path.relative_to(sweep_dir)),
                path=path,
                overrides=dict(_split_override(o) for o in overrides),
                choices={k: str(v) for k, v in (choices or {}).items()},
                budget=_budget_label(policy),
            )
        )
    return jobs


def merged_rows(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """All rows of all jobs (as resume keeps them: the last line per problem), each tagged with its job."""
    varying = _varying_overrides(jobs)
    rows = []
    for job in jobs:
        variant = ",".join(f"{k}={job.overrides[k]}" for k in sorted(varying) if k in job.overrides)
        for row in sorted(load_done(job.path).values(), key=lambda r: r["index"]):
            tags = {
                "job": job.name,
                "controller": row.get("controller") or job.choices.get("controller", ""),
                "verifier": verifier_cell(row),
                "budget": job.budget or _budget_label({"budget_tokens": row.get("budget_tokens")}),
                "variant": variant,
                "overrides": ",".join(f"{k}={v}" for k, v in job.overrides.items()),
            }
            tags |= {f"override.{k}": v for k, v in job.overrides.items()}
            rows.append(row | tags)
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary row per (task, controller, policy, budget, variant), sorted by those keys."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(str(row.get(k, "")) for k in GROUP_KEYS), []).append(row)
    return [dict(zip(GROUP_KEYS, key, strict=True)) | _stats(groups[key]) for key in sorted(groups)]


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [float(r["seconds"]) for r in rows if r.get("seconds") is not None]
    pct = (lambda q: float(np.percentile(seconds, q))) if seconds else (lambda q: math.nan)
    return {
        "problems": len(rows),
        "solved_rate": sum(bool(r.get("solved")) for r in rows) / len(rows),
        "seconds_mean": sum(seconds) / len(seconds) if seconds else math.nan,
        "seconds_p50": pct(50),
        "seconds_p95": pct(95),
        "peak_device_tokens": max(int(r.get("peak_device_tokens") or 0) for r in rows),
        "peak_host_bytes": max(int(r.get("peak_host_bytes") or 0) for r in rows),
        "rehydrations": sum(int(r.get("rehydrations") or 0) for r in rows),
        "oom_rate": sum(bool(r.get("oom")) for r in rows) / len(rows),
    }


# ---- output --------------------------------------------------------------------------------
def summary_table(summary: Sequence[dict[str, Any]], title: str = "sweep", width: int = 80) -> Table | Group:
    """The summary as a rich table fitted to ``width`` (the variant column only when some job has one)."""
    return fit_table(summary, _columns(summary, drop_empty=("variant", "verifier")), title, width)


def markdown_table(summary: Sequence[dict[str, Any]], drop_empty: Sequence[str] = ()) -> str:
    """The summary as a GitHub markdown table (every column; ``drop_empty`` ones only when used)."""
    return _markdown(summary, _columns(summary, drop_empty))


def _columns(summary: Sequence[dict[str, Any]], drop_empty: Sequence[str]) -> list[Column]:
    return [c for c in SUMMARY_COLUMNS if c.key not in drop_empty or any(row.get(c.key) for row in summary)]


# ---- helpers -------------------------------------------------------------------------------
def verifier_cell(row: dict[str, Any]) -> str:
    """A row's verifier as tables show it, with its label: "game24_oracle: oracle (upper bound)"."""
    name, label = row.get("verifier") or "", row.get("verifier_label") or ""
    return f"{name}: {label}" if label else name


def _read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _split_override(text: str) -> tuple[str, str]:
    key, _, value = str(text).partition("=")
    return key.lstrip("+~"), value


def _budget_label(policy: dict[str, Any]) -> str:
    """``0.5x`` for a relative budget, the token count for an absolute one, ``none`` for no cap."""
    if policy.get("budget_ratio") is not None:
        return f"{policy['budget_ratio']}x"
    return str(policy["budget_tokens"]) if policy.get("budget_tokens") is not None else "none"


def _varying_overrides(jobs: Sequence[Job]) -> set[str]:
    """Override keys (outside the group keys) whose value is not the same in every job."""
    keys = {k for job in jobs for k in job.overrides} - GROUPED_OVERRIDES
    return {k for k in keys if len({job.overrides.get(k) for job in jobs}) > 1}
