"""Task data: rows from a local data folder (JSONL or CSV files), or from dataset ids on the
Hugging Face hub through ``datasets`` (the way lm-evaluation-harness loads them) when no folder is set.

A :class:`DataSource` says both where a task's file sits under a data folder (``<data_dir>/<folder>/<file>``,
or the file directly in ``data_dir``) and which hub datasets hold the same rows. ``datasets`` is an
optional dependency (``pip install 'arbor-runtime[hub]'``); it caches what it downloads under
``~/.cache/huggingface``. Every failure is one line naming what to set.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Row = dict[str, Any]


class DataUnavailable(FileNotFoundError):
    """The task's rows are neither in a local data folder nor loadable from the hub."""


@dataclass(frozen=True, slots=True)
class HubPart:
    """One hub dataset (or a local folder ``datasets`` reads) holding some of a split's rows.

    Attributes:
        path: dataset id ("openai/gsm8k") or a local folder of data files.
        split: the dataset's split to read.
        name: the dataset's configuration ("main"), if it has several.
        fields: our field name -> the dataset's column, for columns named differently.
    """

    path: str
    split: str
    name: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DataSource:
    """Where a task's rows come from, per split.

    Attributes:
        folder: the task's folder under a data folder ("gsm8k").
        files: split -> file name in that folder ("test" -> "test.jsonl").
        hub: split -> the hub datasets whose rows, concatenated, make that split.
    """

    folder: str
    files: Mapping[str, str]
    hub: Mapping[str, Sequence[HubPart]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> DataSource:
        """A source from plain config values (``hub`` parts as mappings)."""
        hub = {split: tuple(HubPart(**dict(part)) for part in parts) for split, parts in node.get("hub", {}).items()}
        return cls(str(node["folder"]), dict(node["files"]), hub)

    @property
    def splits(self) -> list[str]:
        """The splits this source has, in declaration order."""
        return list(dict.fromkeys([*self.files, *self.hub]))


def load_rows(
    source: DataSource, split: str, data_dir: str | Path | None, required: Sequence[str], cache_dir: str | None = None
) -> tuple[list[Row], str]:
    """The rows of ``split``, from ``data_dir`` when it is set, else from the hub; and where they came from.

    Raises ValueError for an unknown split or rows without a ``required`` field, and
    :class:`DataUnavailable` when the file or the hub cannot be read.
    """
    if split not in source.splits:
        raise ValueError(f"{source.folder}: split {split!r} is not one of {source.splits}")
    if data_dir is not None:
        path = find_file(data_dir, source.folder, source.files[split])
        return read_rows(path, required), str(path)
    if split not in source.hub:
        raise DataUnavailable(f"{source.folder}: split {split!r} has no hub dataset; set paths.data_dir")
    parts = source.hub[split]
    rows = [_check(row, required, f"{part.path}:{part.split}") for part in parts for row in hub_rows(part, cache_dir)]
    return rows, " + ".join(f"{part.path}:{part.split}" for part in parts)


def find_file(data_dir: str | Path, folder: str, filename: str) -> Path:
    """``data_dir/folder/filename``, or ``data_dir/filename`` (``data_dir`` is a data root or the
    task's own folder); :class:`DataUnavailable` naming both places otherwise."""
    root = Path(data_dir).expanduser()
    tried = [root / folder / filename, root / filename]
    for path in tried:
        if path.is_file():
            return path
    raise DataUnavailable(
        f"data file {folder}/{filename} not found; looked at: {', '.join(map(str, tried))}. "
        "Set paths.data_dir (or task.data_dir) to a folder holding it (see README: Data)."
    )


def read_rows(path: Path, required: Sequence[str]) -> list[Row]:
    """Rows of a ``.jsonl`` or ``.csv`` file; ValueError naming the file and line of a bad row."""
    try:
        return _read_csv(path, required) if path.suffix == ".csv" else _read_jsonl(path, required)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}); valid: a UTF-8 {path.suffix} data file") from None


def _read_jsonl(path: Path, required: Sequence[str]) -> list[Row]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            rows.append(_check(row, required, f"{path}:{number}"))
    return rows


def hub_rows(part: HubPart, cache_dir: str | None = None) -> list[Row]:
    """The rows of one hub dataset split through ``datasets`` (downloaded once into its cache)."""
    try:
        import datasets
    except ImportError:
        raise DataUnavailable(
            f"loading {part.path} needs the optional package `datasets` (pip install 'arbor-runtime[hub]'); "
            "or set paths.data_dir to a folder with the task's files"
        ) from None
    try:
        table = datasets.load_dataset(part.path, part.name, split=part.split, cache_dir=cache_dir)
    except Exception as exc:  # offline, unknown id, bad split: datasets raises many types for these
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataUnavailable(
            f"could not load {part.path} (split {part.split}) through datasets: {reason}. "
            "Offline? Set paths.data_dir to a folder with the task's files (see README: Data)."
        ) from None
    rename = {theirs: ours for ours, theirs in part.fields.items()}
    return [{rename.get(k, k): v for k, v in row.items()} for row in table]


def check_slice(start: int, end: int | None, size: int, name: str) -> tuple[int, int]:
    """Validate a ``[start, end)`` slice over ``size`` rows; ``end=None`` means to the end."""
    for key, value in (("start", start), ("end", end)):
        if not isinstance(value, int) or isinstance(value, bool):
            if value is not None or key == "start":
                raise ValueError(f"{name}: task.{key}={value!r} must be an integer row index >= 0 (end: or null)")
    stop = size if end is None else end
    if start < 0 or stop < 0:
        raise ValueError(f"{name}: task.start={start} / task.end={end} must be >= 0")
    if start > stop:
        raise ValueError(f"{name}: task.start={start} is greater than task.end={stop}")
    if stop > size:
        raise ValueError(f"{name}: task.end={stop} is past the last row; the file has {size} rows (0..{size - 1})")
    return start, stop


def _read_csv(path: Path, required: Sequence[str]) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames  # read while the file is open (an empty file has none)
        rows = list(reader)
    if not fields:
        raise ValueError(f"{path} is empty; expected a CSV header with column(s) {list(required)} and rows")
    missing = [key for key in required if key not in fields]
    if missing:
        raise ValueError(f"{path}: no column(s) {missing}; found columns {fields}")
    if not rows:
        raise ValueError(f"{path} has a header but no rows; expected one problem per row")
    return rows


def _check(row: Any, required: Sequence[str], where: str) -> Row:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [key for key in required if key not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; expected {list(required)}")
    return row
