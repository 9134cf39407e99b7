"""Result files and cells: JSON lines (appended crash-safely), CSV, markdown tables, cell formatting.

A run dir holds ``results.jsonl`` (one line per problem, appended as each finishes), ``traces.jsonl``,
``events.jsonl``, ``results.csv`` (rewritten with every row), the fingerprint of the config and data
that wrote them and the writer's lock (see :mod:`arbor_cli.resume`), and ``<file>.corrupt`` for lines
that were not whole JSON records (set aside, never lost). Every table in the project (terminal,
markdown, CSV) formats its cells with :func:`format_cell`, from one :class:`Column` list per table.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"
TRACES_FILE = "traces.jsonl"
EVENTS_FILE = "events.jsonl"
CSV_FILE = "results.csv"
TREES_DIR = "trees"

Row = dict[str, Any]
log = logging.getLogger(__name__)


# ---- JSON lines ------------------------------------------------------------------------------
#: where lines that are not whole JSON go (appended): ``results.jsonl`` -> ``results.jsonl.corrupt``
CORRUPT_SUFFIX = ".corrupt"


def append_jsonl(path: Path, row: Row) -> None:
    """Append one JSON line and flush it to disk, so an interrupted run loses nothing finished.

    A torn last line (an earlier run stopped mid-write) is moved aside first (:func:`repair_jsonl`),
    so the new line never lands on it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_jsonl(path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def repair_jsonl(path: Path) -> bool:
    """Make ``path`` end at a line break: a last line without one is kept (newline added) when it
    is a whole JSON value, else moved to ``<path>.corrupt``. Returns whether the file changed."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return False
    cut = data.rfind(b"\n") + 1  # 0 when the torn line is the only one
    try:
        json.loads(data[cut:])
    except ValueError:
        _set_aside(path, [data[cut:]])
        with path.open("r+b") as fh:
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())
        return True
    with path.open("ab") as fh:
        fh.write(b"\n")
    return True


def clean_jsonl(path: Path, keep: Callable[[int], bool] | None = None) -> tuple[int, int]:
    """Rewrite a run dir's JSON-lines file so that it holds one whole record per problem index.

    Lines that are not a JSON object with an integer ``index`` (torn or corrupt) are moved to
    ``<path>.corrupt`` (appended, never lost); of several records of one index the last is kept (the
    latest run's; the first's place in the file); records whose index ``keep`` refuses are dropped
    (events and traces of a problem without a results row: it runs again and writes them anew).
    The file is replaced atomically, and only when something changed. Returns (lines set aside,
    records dropped).
    """
    if not path.is_file():
        return 0, 0
    lines = path.read_bytes().splitlines()
    records: dict[int, bytes] = {}
    corrupt, numbers = [], []
    for number, line in enumerate(lines, 1):
        index = _record_index(line)
        if index is None:
            corrupt += [line] if line.strip() else []
            numbers += [number] if line.strip() else []
        else:
            records[index] = line
    kept = {i: line for i, line in records.items() if keep is None or keep(i)}
    dropped = len(lines) - len(corrupt) - len(kept) - sum(not line.strip() for line in lines)
    if corrupt:
        shown = ", ".join(map(str, numbers[:5])) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
        log.warning(
            "%s: line %s not a record (a JSON object with an integer index): moved to %s",
            path, shown, path.name + CORRUPT_SUFFIX,
        )  # fmt: skip
        _set_aside(path, corrupt)
    if corrupt or dropped or any(not line.strip() for line in lines):
        _replace(path, b"".join(line + b"\n" for line in kept.values()))
    return len(corrupt), dropped


def read_jsonl(path: Path) -> list[Row]:
    """Every whole line of a JSON-lines file (a torn last line is left out); [] when it is missing."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by an interrupted run: that problem runs again
    return rows


def write_jsonl(path: Path, rows: Iterable[Row]) -> Path:
    """Write ``rows`` as JSON lines (replacing the file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows), encoding="utf-8")
    return path


def load_done(run_dir: Path) -> dict[int, Row]:
    """Problems already finished in ``run_dir`` (by problem index; the last line of each wins). Lines that
    are not records (:func:`read_records`) are left out: a run's claim moves them aside, naming them."""
    return {row["index"]: row for row in read_records(Path(run_dir) / RESULTS_FILE)}


def read_records(path: Path) -> list[Row]:
    """The run-dir records of a JSON-lines file: whole lines holding a JSON object with an integer
    ``index`` (``{"foo": 1}``, ``{"index": "abc"}``, ``[1, 2, 3]`` or ``null`` are not); [] when missing."""
    return scan_records(path)[0]


def scan_records(path: Path) -> tuple[list[Row], list[int]]:
    """:func:`read_records` and the numbers (from 1) of the other non-empty lines."""
    if not path.is_file():
        return [], []
    rows, other = [], []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        index = _record_index(line)
        if index is not None:
            rows.append(json.loads(line))
        elif line.strip():
            other.append(number)
    return rows, other


def record_index(record: Any) -> int | None:
    """The problem index of a parsed run-dir record; None when it is not one."""
    index = record.get("index") if isinstance(record, dict) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def _record_index(line: bytes) -> int | None:
    """The problem index of a run-dir record line; None when the line is not one (torn, corrupt)."""
    try:
        return record_index(json.loads(line))
    except ValueError:
        return None


def _set_aside(path: Path, lines: Sequence[bytes]) -> None:
    """Append ``lines`` to ``<path>.corrupt`` (each ending in a line break), on disk before returning."""
    with path.with_name(path.name + CORRUPT_SUFFIX).open("ab") as fh:
        fh.write(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
        fh.flush()
        os.fsync(fh.fileno())


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, synced, then renamed over it
    (a reader or a kill sees the old file or the new one, never half of one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# ---- CSV --------------------------------------------------------------------------------------
def write_csv(path: Path, rows: Sequence[Row], first: Sequence[str] = ()) -> Path:
    """Rows as CSV: the ``first`` columns, then every other field in order of first appearance.

    Only scalar fields (lists and dicts, e.g. memory series, stay in the JSON lines).
    """
    fields: dict[str, None] = {}
    for row in rows:
        fields.update((k, None) for k, v in row.items() if not isinstance(v, (list, dict)))
    order = [k for k in first if k in fields] + [k for k in fields if k not in first]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=order, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    _replace(path, text.getvalue().encode("utf-8"))  # rewritten as rows come in: never half a file
    return path


# ---- cells and tables ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table: the row key, the header, the cell format (see :func:`format_cell`),
    whether it is a label (left-aligned), and its rank when a narrow table must drop columns
    (lower ranks stay longest)."""

    key: str
    header: str
    fmt: str = "{}"
    label: bool = False
    rank: int = 0


def format_cell(value: Any, fmt: str = "auto") -> str:
    """A value as table text: None / NaN as "-", booleans as yes / no, then by ``fmt``:

    - a format string such as ``"{:,}"`` or ``"{:.2f}"``;
    - ``"mb"``: bytes in MiB (two decimals below 10 MiB, one above);
    - ``"%"``: a rate in [0, 1] as a whole percentage;
    - ``"auto"``: integers with thousands separators, other numbers to 4 significant digits
      (numbers given as text, as read back from CSV, too), anything else as text.
    """
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or value in ("True", "False"):
        return "yes" if value in (True, "True") else "no"
    if fmt == "mb":
        mib = float(value) / 2**20
        return f"{mib:.2f}" if abs(mib) < 10 else f"{mib:.1f}"
    if fmt == "%":
        return f"{100 * float(value):.0f}%"
    if fmt == "auto":
        return _auto(value)
    return fmt.format(value)


def markdown_table(rows: Sequence[Row], columns: Sequence[Column]) -> str:
    """``rows`` as a GitHub markdown table (labels left-aligned, numbers right-aligned)."""
    lines = ["| " + " | ".join(c.header for c in columns) + " |"]
    lines.append("|" + "|".join("---" if c.label else "---:" for c in columns) + "|")
    for row in rows:
        cells = (format_cell(row.get(c.key), c.fmt).replace("|", "\\|") for c in columns)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _auto(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = float(value) if any(ch in value for ch in ".eE") else int(value)
        except ValueError:
            return value
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
