"""Which code produced a result: every results row records it (``code``), so a run resumed over
several sittings, or a benchmark whose run dirs were filled at different commits, says so.

From a git checkout (the repository on PYTHONPATH or an editable install) the code is the commit,
``<sha>+dirty`` when tracked files differ from it; from an installed wheel it is the package and
its version. Computed once per process (a Ray actor computes its own).
"""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

#: the checkout this package sits in, when it sits in one
_ROOT = Path(__file__).resolve().parents[1]
_DIST = "arbor-runtime"


@functools.cache
def code_version() -> str:
    """``<40-hex sha>`` or ``<sha>+dirty`` for a git checkout; else ``arbor-runtime <version>``
    (``arbor-runtime unknown`` when not even the distribution is installed)."""
    sha = _git(["rev-parse", "HEAD"]) if (_ROOT / ".git").exists() else None
    if sha:
        return sha + ("+dirty" if _git(["status", "--porcelain", "-uno"]) else "")
    try:
        return f"{_DIST} {metadata.version(_DIST)}"
    except metadata.PackageNotFoundError:
        return f"{_DIST} unknown"


def _git(args: list[str]) -> str | None:
    """``git args`` in the checkout: its stripped output, or None when git is missing or fails."""
    try:
        done = subprocess.run(["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
