"""The committed results format: one JSON file per results section under ``docs/data/<section>/``.

``docs/data/<section>/results.json``::

    {"format": 1, "section": "linear", "title": "...",
     "command": "python scripts/bench_linear.py ...",     # what produced the rows
     "commit": "1e0dd53..." | null, "measured": "2026-11-30", "machine": "x86_64, 2 CPUs, ...",
     "settings": {...},                                    # the knobs that are not in the command
     "tables": {"main": {"columns": [{"key", "header", "fmt", "numeric"}], "rows": [{key: value}]}},
     "facts": {"name": value},                             # single figures the section's prose quotes
     "source": "...",                                      # how the file came to be (a run, or the migration)
     "carried": {"measured", "commit", "tables", "facts"}}   # parts kept from an earlier measurement, if any

A benchmark calls :func:`write_section_data` at the end of its run; ``make results-page`` renders the
page from these files alone (:mod:`benchmarks.results.page`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: where the committed results live
DATA = REPO / "docs" / "data"
FORMAT = 1

#: what a benchmark's numbers depend on (the runtime code): a change here makes every step of `make results`
#: start over, and the results page groups its sections by it
RUNTIME = ("arbor_cli", "arbor_runtime", "conf", "controllers", "research", "tasks", "verifiers", "pyproject.toml")


def commit() -> str | None:
    """The checkout's commit (``+dirty`` when tracked files differ from it, other than what measuring
    writes: docs/, README.md), or None outside git (:func:`arbor_cli.provenance.checkout_commit`)."""
    # imported here: rendering the page (which never writes data) runs on a bare python3, and the
    # arbor_cli package imports omegaconf
    from arbor_cli.provenance import checkout_commit

    return checkout_commit(REPO)


def runtime_code(repo: Path = REPO, rev: str | None = None) -> str | None:
    """12 hex digits naming the runtime's code: the trees of :data:`RUNTIME` at HEAD plus the uncommitted
    changes to them, or (``rev``: a commit) the trees at that commit; None outside a git checkout or when
    ``rev`` is not in its history. A clean checkout of a commit and ``rev=`` that commit give the same code."""
    try:
        if rev is not None:
            subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=repo, capture_output=True, check=True)
        trees = [_git_out(["rev-parse", "--verify", "--quiet", f"{rev or 'HEAD'}:{p}"], repo) for p in RUNTIME]
        diff = b""
        if rev is None:
            done = subprocess.run(["git", "diff", "HEAD", "--", *RUNTIME], cwd=repo, capture_output=True, check=True)
            diff = done.stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    h = hashlib.sha1("".join(trees).encode())
    h.update(diff)
    return h.hexdigest()[:12]


#: docs/data/runtime-codes.json: each commit docs/data names -> its runtime code (null: measured with
#: uncommitted changes, or a commit not in this history), so the page groups sections without git
RUNTIME_CODES = "runtime-codes.json"


def load_runtime_codes(root: Path | None = None) -> dict[str, str | None]:
    """The committed map of commit -> runtime code (empty when there is none yet)."""
    path = (root or DATA) / RUNTIME_CODES
    return json.loads(path.read_text()) if path.is_file() else {}


def update_runtime_codes(commits: list[str], root: Path | None = None, repo: Path = REPO) -> dict[str, str | None]:
    """Add the commits the map lacks (``<sha>+dirty`` maps to null: the uncommitted changes are not in
    git) and write it back when something was added; a commit git does not know (no checkout, a shallow
    clone) is left out, so a later run in a full checkout adds it. Returns the map."""
    codes = load_runtime_codes(root)
    added = {}
    for c in dict.fromkeys(commits):
        if c in codes:
            continue
        if c.endswith("+dirty"):
            added[c] = None
        elif (code := runtime_code(repo, rev=c)) is not None:
            added[c] = code
    if added:
        codes = dict(sorted((codes | added).items()))
        path = (root or DATA) / RUNTIME_CODES
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(codes, indent=1) + "\n")
    return codes


def _git_out(args: list[str], repo: Path) -> str:
    """``git args``'s output ('' when it fails: a path missing at that commit names no tree)."""
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True).stdout


def machine() -> str:
    """The machine in words: architecture, CPUs, GPU if torch (already imported) sees one, Python, torch."""
    parts = [f"{platform.machine()}", f"{os.cpu_count()} CPUs", f"Python {platform.python_version()}"]
    torch = sys.modules.get("torch")
    if torch is not None:
        parts.append(f"torch {torch.__version__}")
        if torch.cuda.is_available():
            parts.insert(2, torch.cuda.get_device_name(0))
    else:  # a collector that reads a benchmark's outputs need not import torch to name it
        try:
            parts.append(f"torch {metadata.version('torch')}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(parts)


def columns_spec(spec) -> list[dict]:
    """Column dicts from ``(key, header, fmt)`` tuples: numbers right-aligned unless ``fmt`` is ``"text"``;
    a fourth element overrides that (a text column of rates that sorts as numbers: ``True``)."""
    return [
        {"key": key, "header": header, "fmt": fmt, "numeric": rest[0] if rest else fmt != "text"}
        for key, header, fmt, *rest in spec
    ]


def columns_for(rows: list[dict], fmts: dict[str, str] | None = None) -> list[dict]:
    """Columns for ``rows`` in first-seen key order: header = key, numbers right-aligned, ``fmts`` per key."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    fmts = fmts or {}
    out = []
    for key in keys:
        numeric = all(isinstance(r.get(key), (int, float)) for r in rows if r.get(key) is not None)
        out.append({"key": key, "header": key, "fmt": fmts.get(key, "auto"), "numeric": numeric})
    return out


def write_section_data(
    name: str,
    rows: list[dict[str, Any]],
    command: str,
    settings: dict[str, Any] | None = None,
    *,
    title: str | None = None,
    columns: list[dict] | None = None,
    tables: dict[str, dict] | None = None,
    facts: dict[str, Any] | None = None,
    carried: dict[str, Any] | None = None,
    root: Path | None = None,
    **measured: Any,
) -> Path:
    """Write ``docs/data/<name>/results.json`` for one results section, with this run's provenance.

    ``rows`` is the section's main table (``columns`` from :func:`columns_for` unless given; extra
    tables go in ``tables``); commit, date (UTC) and machine are added here so every benchmark
    records them the same way. ``carried`` names what was kept from an earlier measurement (its date,
    commit, tables and facts); the page says so. ``measured``: what the rows say of the code that
    measured them, over this checkout's commit (``commit``, and ``row_codes``: rows per code, when
    they came from several). Returns the path written.
    """
    unknown = set(measured) - {"commit", "row_codes"}
    if unknown:
        raise TypeError(f"write_section_data: unexpected {sorted(unknown)}")
    path = (root or DATA) / name / "results.json"
    old = load_section(name, root) if path.is_file() else {}
    all_tables = {"main": {"columns": columns or columns_for(rows), "rows": rows}} | (tables or {})
    doc = {
        "format": FORMAT,
        "section": name,
        "title": title or old.get("title", name),
        "command": command,
        "commit": commit(),
        "measured": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "machine": machine(),
        "settings": settings or {},
        "tables": all_tables,
        "facts": facts or {},
        "source": "run",
    } | measured
    if carried:
        doc["carried"] = carried
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return path


def load_section(name: str, root: Path | None = None) -> dict:
    """The section's data file as a dict; a missing or older-format file is an error naming the path."""
    path = (root or DATA) / name / "results.json"
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected {FORMAT}")
    return doc
