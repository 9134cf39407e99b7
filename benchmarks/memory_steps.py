"""Memory over the steps of one live search, per policy (the ArborKV paper's Figure 3 on today's runtime).

Reads ``arbor-solve`` run dirs of the same problem (one per policy; a full run without a budget and
one or more budgeted runs) and writes ``docs/data/memory-steps/results.json``:

- ``main``: one row per run: policy, budget, steps, peak device and host tokens, evictions
  (memory-threshold events), branch switches, rehydrations, seconds, the answer, and whether the
  search built the same tree as the first run (every node's parent, text and token count equal);
- ``steps``: one row per trace step and run: the op, device (resident) and host tokens, and the
  step's branch switches, thresholds and rehydrations (what the figure marks).

The figure (``docs/memory-steps.png``) is drawn from that file alone by
:func:`benchmarks.results.plots.memory_steps` (``make results-plots``).

    python -m benchmarks.memory_steps RUN_DIR_FULL RUN_DIR_ARBOR --command "arbor-solve ...; ..."
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from arbor_cli.results import read_jsonl
from benchmarks.results.data import columns_spec, write_section_data

SECTION = "memory-steps"
TITLE = "Memory over search steps (one live search per policy)"

MAIN_COLUMNS = [
    ("policy", "policy", "text"), ("budget", "budget tok", "auto"), ("steps", "steps", "auto"),
    ("peak_device", "peak device tok", "auto"), ("peak_host", "peak host tok", "auto"),
    ("thresholds", "evictions (threshold events)", "auto"), ("branch_switches", "branch switches", "auto"),
    ("rehydrations", "rehydrations", "auto"), ("seconds", "seconds", "{:.1f}"), ("answer", "answer", "text"),
    ("same_tree", "same tree as full", "text"),
]  # fmt: skip
STEP_KEYS = ("policy", "step", "op", "device", "host", "switches", "thresholds", "rehydrations")


def _one(path: Path, index: int | None) -> dict[str, Any]:
    """The line of ``path`` for problem ``index`` (the only line when None)."""
    rows = read_jsonl(path)
    if index is not None:
        rows = [r for r in rows if r.get("index") == index]
    if len(rows) != 1:
        raise SystemExit(f"memory_steps: error: {path}: expected one line for problem {index}, found {len(rows)}")
    return rows[0]


def _tree_shape(run_dir: Path, index: int) -> list[tuple]:
    """Every node's (id, parent, text, tokens): two searches with equal shapes built the same tree."""
    tree = json.loads((run_dir / "trees" / f"{index}.json").read_text())
    return [(n["id"], n["parent"], n["text"], n["tokens"]) for n in tree["nodes"]]


def run_series(run_dir: Path, index: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]], list[tuple]]:
    """(summary row, per-step rows, tree shape) of one run dir's problem ``index``."""
    result = _one(run_dir / "results.jsonl", index)
    index = result["index"]
    trace = _one(run_dir / "traces.jsonl", index)["trace"]
    events = _one(run_dir / "events.jsonl", index)["events"]
    label = result["policy"] + (f"@{result['budget_tokens']}" if result.get("budget_tokens") else "")
    kinds = ("branch_switch", "memory_threshold")
    per_step = {kind: Counter(e["step"] for e in events if e["kind"] == kind) for kind in kinds}
    steps, before = [], 0
    for point in trace:
        steps.append({
            "policy": label, "step": point["step"], "op": point["op"], "device": point["resident_tokens"],
            "host": point["host_tokens"], "switches": per_step["branch_switch"][point["step"]],
            "thresholds": per_step["memory_threshold"][point["step"]], "rehydrations": point["rehydrations"] - before,
        })  # fmt: skip
        before = point["rehydrations"]
    row = {
        "policy": label,
        "budget": result.get("budget_tokens") or "none",
        "steps": len(trace),
        "peak_device": result.get("peak_device_tokens") or max(p["peak_tokens"] for p in trace),
        "peak_host": max(p["host_tokens"] for p in trace),
        "thresholds": sum(per_step["memory_threshold"].values()),
        "branch_switches": sum(per_step["branch_switch"].values()),
        "rehydrations": before,
        "seconds": result["seconds"],
        "answer": result.get("answer") or "-",
    }
    return row, steps, _tree_shape(run_dir, index)


def collect(run_dirs: list[Path], index: int | None = None) -> tuple[list[dict], list[dict]]:
    """Summary rows (the first run is the reference tree) and every run's per-step rows."""
    rows, steps, reference = [], [], None
    for run_dir in run_dirs:
        row, mine, shape = run_series(run_dir, index)
        reference = shape if reference is None else reference
        row["same_tree"] = "yes" if shape == reference else "no"
        rows.append(row)
        steps += mine
    return rows, steps


def write(run_dirs: list[Path], command: str, index: int | None = None, root: Path | None = None) -> Path:
    """``docs/data/memory-steps/results.json`` (or under ``root``) from the run dirs."""
    rows, steps = collect(run_dirs, index)
    columns = columns_spec(MAIN_COLUMNS)
    step_columns = [{"key": k, "header": k, "fmt": "auto", "numeric": k not in ("policy", "op")} for k in STEP_KEYS]
    settings = {"run_dirs": [p.name for p in run_dirs], "problem": index}
    return write_section_data(
        SECTION, rows, command, settings, title=TITLE, columns=columns,
        tables={"steps": {"columns": step_columns, "rows": steps}}, root=root,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+", type=Path, help="arbor-solve run dirs; the first is the reference")
    ap.add_argument("--command", required=True, help="the commands that produced the run dirs (recorded)")
    ap.add_argument("--index", type=int, default=None, help="the problem (default: each run dir's only one)")
    ap.add_argument("--data-root", type=Path, default=None, help="docs/data by default")
    args = ap.parse_args(argv)
    print(f"wrote {write(args.run_dirs, args.command, args.index, args.data_root)}")


if __name__ == "__main__":
    main()
