"""Result files of a run: one JSON line per problem (appended as each finishes), plus traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"
TRACES_FILE = "traces.jsonl"
EVENTS_FILE = "events.jsonl"
TREES_DIR = "trees"


def load_done(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Problems already finished in ``run_dir`` (by problem index); tolerates a torn last line."""
    path = run_dir / RESULTS_FILE
    done: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interrupted run: that problem runs again
        done[int(row["index"])] = row
    return done


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line and flush it to disk, so an interrupted run loses nothing finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(row, default=str) + "\n")
        fh.flush()
