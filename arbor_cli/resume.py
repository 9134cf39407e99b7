"""Resuming a run in its directory: which config wrote it, and whether a rerun may add to it.

The first run in a directory stores a fingerprint of its composed config there
(``config_fingerprint.json``). A rerun with ``resume=true`` (the default) skips the problems
already in ``results.jsonl``, and refuses to start when its own fingerprint differs: rows of two
configs would be mixed in one table. ``resume=force`` adds to the directory anyway (and stores the
new fingerprint); ``resume=false`` refuses any directory that already holds results.

Keys that do not change any problem's result are left out of the fingerprint: where data and
outputs live (``paths``, ``task.data_dir``, ``run_dir``, ``task.cache_dir``), which problems of the
data set run (``task.start`` / ``task.end``: widening the slice and rerunning is how a run grows),
output switches (``show_tree``, ``save_trees``, ``view``, ``resume``), and where the searches run
(``concurrency``, ``runner``: a run started locally may resume on Ray actors and back).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from arbor_cli.results import RESULTS_FILE

FINGERPRINT_FILE = "config_fingerprint.json"
#: dotted config keys left out of the fingerprint (see the module docstring)
IGNORED_KEYS = (
    "paths", "run_dir", "resume", "show_tree", "save_trees", "view", "concurrency", "runner",
    "task.data_dir", "task.cache_dir", "task.start", "task.end",
)  # fmt: skip
RESUME_MODES = (True, False, "force")


class ConfigMismatch(ValueError):
    """A rerun's config differs from the one that wrote the run dir (and ``resume`` is not force)."""


def fingerprint(cfg: DictConfig) -> tuple[str, dict[str, Any]]:
    """The fingerprint of a composed config (a short sha256) and the flat settings it hashes."""
    flat = _flatten(OmegaConf.to_container(cfg, resolve=True))
    kept = {k: v for k, v in flat.items() if not any(k == i or k.startswith(i + ".") for i in IGNORED_KEYS)}
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return digest, kept


def check_resume(run_dir: Path, cfg: DictConfig) -> None:
    """Refuse (:class:`ConfigMismatch`, one line) when ``run_dir`` cannot take this run; else store
    the config's fingerprint there."""
    mode = cfg.get("resume", True)
    if mode not in RESUME_MODES:
        raise ValueError(f"resume={mode!r} must be one of true, false, force")
    has_results = (run_dir / RESULTS_FILE).is_file() and (run_dir / RESULTS_FILE).stat().st_size > 0
    if has_results and mode is False:
        raise ConfigMismatch(f"run dir {run_dir} already holds results and resume=false; pick another run_dir")
    digest, settings = fingerprint(cfg)
    stored = _read(run_dir)
    if has_results and stored is not None and stored["fingerprint"] != digest and mode != "force":
        changes = _diff(stored.get("settings", {}), settings)
        raise ConfigMismatch(
            f"run dir {run_dir} holds results of another config ({changes}); rerun with resume=force to add "
            "to it anyway, or pick another run_dir"
        )
    path = run_dir / FINGERPRINT_FILE
    path.write_text(json.dumps({"fingerprint": digest, "settings": settings}, indent=1, sort_keys=True) + "\n")


def _read(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / FINGERPRINT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested settings as one level of dotted keys ("controller.n_generate")."""
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}{key}."))
    return out


def _diff(old: dict[str, Any], new: dict[str, Any], limit: int = 3) -> str:
    """The first few settings that differ, as ``key: old -> new``."""
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    shown = [f"{k}: {json.dumps(old.get(k))} -> {json.dumps(new.get(k))}" for k in keys[:limit]]
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(shown) + more
