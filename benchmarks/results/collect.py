"""Sections' data from benchmarks that still write their own JSONL under bench/ (until each calls
:func:`~benchmarks.results.data.write_section_data` itself).

    python -m benchmarks.results.collect concurrency bench/concurrency \
        --command "python scripts/bench_concurrency.py ..."

A collector globs the benchmark's files, renames its keys to the committed section's column keys
(so the section's template keeps working), and writes docs/data/<section>/results.json with this
run's commit, date and machine. Booleans become yes / no, as the tables show them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from .data import DATA, load_section, write_section_data

FOLDER = "<folder>"  # the row's value is the name of the folder its file is in (one search per folder)


@dataclass(frozen=True, slots=True)
class Collector:
    """``pattern`` under the benchmark's output folder; ``keys``: section column key -> benchmark key."""

    pattern: str
    keys: dict[str, str]


COLLECTORS = {
    "concurrency": Collector(
        "*/concurrency.jsonl",
        {
            "search": FOLDER, "policy": "policy", "concurrency": "concurrency", "problems": "problems",
            "seconds": "seconds", "problems_hour": "problems_per_hour", "peak_kv_mb": "peak_device_mb",
            "decode_tokens": "decode_tokens", "oom": "oom", "same_results_as_1": "same_results_as_concurrency_1",
        },
    ),
    "budgets": Collector(
        "*/budgets.jsonl",
        {
            "search": FOLDER, "problem": "problem", "policy": "policy", "budget_tok": "budget",
            "x_full_peak": "fraction", "floor": "floor_fraction", "oom": "oom", "same_tree_as_full": "same_tree",
            "max_d_logprob": "max_logprob_gap", "time_full": "time_vs_full", "preemptions": "preemptions",
            "rehydrations": "rehydrations", "peak_kv_mb": "peak_device_mb", "peak_host_mb": "peak_host_mb",
        },
    ),
}  # fmt: skip


def _cell(value):
    return ("yes" if value else "no") if isinstance(value, bool) else value


def rows(name: str, root: Path) -> list[dict]:
    """The benchmark's rows under ``root`` with the section's column keys (missing keys are None)."""
    spec = COLLECTORS[name]
    out = []
    for path in sorted(root.glob(spec.pattern)):
        for line in path.read_text().splitlines():
            if line.strip():
                raw = json.loads(line)
                out.append({k: path.parent.name if b == FOLDER else _cell(raw.get(b)) for k, b in spec.keys.items()})
    return out


def write(name: str, root: Path, command: str, settings: dict | None = None, data_root: Path | None = None) -> Path:
    """Write docs/data/<name>/results.json from the benchmark's outputs under ``root``."""
    found = rows(name, root)
    if not found:
        raise SystemExit(f"collect: error: no {COLLECTORS[name].pattern} under {root}")
    committed = load_section(name, DATA)  # its columns and title are what the template expects
    return write_section_data(
        name,
        found,
        command,
        settings,
        title=committed["title"],
        columns=committed["tables"]["main"]["columns"],
        root=data_root,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=sorted(COLLECTORS))
    ap.add_argument("outputs", type=Path, help="the benchmark's --out folder (one subfolder per search)")
    ap.add_argument("--command", required=True, help="the command that produced the outputs (recorded)")
    ap.add_argument("--data-root", type=Path, default=None, help="docs/data by default")
    args = ap.parse_args(argv)
    print(f"wrote {write(args.section, args.outputs, args.command, data_root=args.data_root)}")


if __name__ == "__main__":
    main()
