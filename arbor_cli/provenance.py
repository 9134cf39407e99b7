"""Which code produced a result: every results row records it (``code``), so a run resumed over
several sittings, or a benchmark whose run dirs were filled at different commits, says so.

From a git checkout (the repository on PYTHONPATH or an editable install) the code is the commit,
``<sha>+dirty`` when tracked files other than what measuring writes (docs/, README.md) differ from it;
from an installed wheel it is the package and its version. Computed once per process (a Ray actor
computes its own).
"""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

#: the checkout this package sits in, when it sits in one
_ROOT = Path(__file__).resolve().parents[1]
_DIST = "arbor-runtime"


#: what measuring writes into the checkout (docs/data, the generated page and its plots, README's
#: headline table): uncommitted changes there do not make the code that measured "dirty"
OUTPUTS = ("docs", "README.md")


def checkout_commit(root: Path | None = None) -> str | None:
    """The checkout's commit, ``<sha>+dirty`` when tracked files outside :data:`OUTPUTS` differ from it;
    None when ``root`` (this package's checkout by default) is not a git checkout or git is missing."""
    root = _ROOT if root is None else root
    sha = _git(["rev-parse", "HEAD"], root) if (root / ".git").exists() else None
    if not sha:
        return None
    changed = _git(["status", "--porcelain", "-uno", "--", ".", *(f":(exclude){p}" for p in OUTPUTS)], root)
    return sha + ("+dirty" if changed else "")


@functools.cache
def code_version() -> str:
    """``<40-hex sha>`` or ``<sha>+dirty`` for a git checkout (:func:`checkout_commit`); else
    ``arbor-runtime <version>`` (``arbor-runtime unknown`` when not even the distribution is installed)."""
    commit = checkout_commit()
    if commit:
        return commit
    try:
        return f"{_DIST} {metadata.version(_DIST)}"
    except metadata.PackageNotFoundError:
        return f"{_DIST} unknown"


def _git(args: list[str], root: Path | None = None) -> str | None:
    """``git args`` in the checkout: its stripped output, or None when git is missing or fails."""
    try:
        done = subprocess.run(["git", *args], cwd=root or _ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
