"""Where the runtime keeps what it writes for later runs: converted models (:mod:`arbor_runtime.loading`) and
a user's sparse-read calibrations (:mod:`arbor_runtime.sparse.calibrated`). A leaf module: both import it."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Folder for converted models and calibrations: argument, ``$ARBOR_CACHE_DIR``, or ``~/.cache/arbor_runtime``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ARBOR_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "arbor_runtime"
    return base.expanduser()
