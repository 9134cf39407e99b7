"""What a viewer page shows, read from a run dir: one plain dict per problem (embedded as JSON).

A page's data::

    {"index", "question", "row" (the results row's scalar fields), "tree" (trees/<index>.json as
     written, or None), "trace" (traces.jsonl), "events" (events.jsonl), "residency"
     (residency.jsonl, or None for a run dir written before it existed), "event_steps" (the trace
     step of each event), "budget" (device KV budget in tokens, or None)}
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from arbor_cli.residency import RESIDENCY_FILE
from arbor_cli.results import EVENTS_FILE, RESULTS_FILE, TRACES_FILE, scan_records
from arbor_cli.tree_export import load_tree, tree_paths

#: results-row fields a page and the index table show
ROW_FIELDS = (
    "index", "question", "solved", "answer", "oom", "error", "policy", "controller", "verifier", "budget_tokens",
    "peak_device_tokens", "peak_host_tokens", "rehydrations", "evicted_tokens", "dropped_tokens", "steps",
    "seconds", "nodes_created", "best_path",
)  # fmt: skip
log = logging.getLogger(__name__)


def run_pages(run_dir: Path) -> list[dict[str, Any]]:
    """Every problem of ``run_dir``'s results (by index) as page data; [] when it has none."""
    run_dir = Path(run_dir)
    rows = _by_index(_records(run_dir / RESULTS_FILE))
    traces = _by_index(_records(run_dir / TRACES_FILE))
    events = _by_index(_records(run_dir / EVENTS_FILE))
    residency = _by_index(_records(run_dir / RESIDENCY_FILE))
    pages = []
    for index in sorted(rows):
        trace = traces.get(index, {}).get("trace", [])
        evs = events.get(index, {}).get("events", [])
        res = residency.get(index)
        pages.append(
            {
                "index": index,
                "question": rows[index].get("question"),
                "row": {k: _finite(rows[index].get(k)) for k in ROW_FIELDS if k in rows[index]},
                "tree": _finite(_tree(run_dir, index)),
                "trace": _finite(trace),
                "events": _finite(evs),
                "residency": res,
                "event_steps": event_steps(res, trace, evs),
                "budget": rows[index].get("budget_tokens"),
            }
        )
    return pages


def event_steps(residency: dict[str, Any] | None, trace: list[dict], events: list[dict]) -> list[int]:
    """The trace step of each event: recorded with the residency, else from the trace's running event
    count (an event ``seq`` belongs to the first step whose count exceeds it)."""
    if residency is not None and len(residency.get("event_steps", [])) == len(events):
        return list(residency["event_steps"])
    out, at = [], 0
    for ev in events:
        while at < len(trace) - 1 and trace[at].get("events", 0) <= ev.get("seq", 0):
            at += 1
        out.append(trace[at]["step"] if trace else 0)
    return out


def _by_index(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["index"]: r for r in rows}  # the last line of each problem wins


def _records(path: Path) -> list[dict[str, Any]]:
    """The file's records; one warning naming the file and the lines that are not records (left out)."""
    rows, other = scan_records(path)
    if other:
        shown = ", ".join(map(str, other[:5])) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        log.warning("%s: line %s not a record (a JSON object with an integer index): left out", path, shown)
    return rows


def _tree(run_dir: Path, index: int) -> dict[str, Any] | None:
    """``trees/<index>.json``, or None with one warning naming it when it is not whole JSON (the page then
    shows no tree; the rest of the run's pages are written)."""
    try:
        return load_tree(run_dir, index)
    except (ValueError, OSError) as exc:
        log.warning("%s: not a readable tree (%s); problem %d's page shows none", tree_paths(run_dir, index)[0],
                    str(exc).splitlines()[0], index)  # fmt: skip
        return None


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON.parse takes no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
