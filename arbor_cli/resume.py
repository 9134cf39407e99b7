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
(``concurrency``, ``runner``: a run started locally may resume on Ray actors and back), and whether trees
of a runtime share a stored prompt prefix (``share_prefixes``: the same results, less memory).

The data a run read is part of the fingerprint too, kept beside the config's settings (``data``):
where its rows came from, the file's size, and a hash of each problem's row by index. A rerun
refuses when the file's size differs or when a problem already done has another row now (its
result would sit beside rows of another file); a widened slice adds the hashes of its new rows, and
a file that moved (same size, same rows) resumes. The hashes, not the path, decide.

One run writes a run dir at a time: :func:`claim` takes an exclusive lock (``fcntl.flock`` on
``run.lock``, holding the writer's pid) before it checks the fingerprint, and the run holds it
until its last row is written. The kernel drops the lock when its process ends, however it ends,
so a stale ``run.lock`` never blocks. After the checks, :func:`claim` cleans the JSON-lines files:
torn or corrupt lines go to ``<file>.corrupt``, and events and traces of problems without a results
row are dropped (a problem is done once its row, written last, is): each problem then appears once
in every file after the rerun.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from arbor_cli.residency import RESIDENCY_FILE
from arbor_cli.results import EVENTS_FILE, RESULTS_FILE, TRACES_FILE, clean_jsonl, load_done

if TYPE_CHECKING:
    from arbor_runtime.tasks.base import Problem, Task

log = logging.getLogger(__name__)
FINGERPRINT_FILE = "config_fingerprint.json"
LOCK_FILE = "run.lock"
#: dotted config keys left out of the fingerprint (see the module docstring)
IGNORED_KEYS = (
    "paths", "run_dir", "resume", "show_tree", "save_trees", "view", "concurrency", "share_prefixes", "runner",
    "task.data_dir", "task.cache_dir", "task.start", "task.end", "policy.reference_may_differ",
)  # fmt: skip
RESUME_MODES = (True, False, "force")
#: settings added to the shipped configs after run dirs were written, each with the value that behaves
#: as the runtime did before it existed: stored settings without the key read as that value, so a run
#: made before the key was added resumes when the rerun leaves it there (and refuses when it does not)
ADDED_KEYS: dict[str, Any] = {
    "verifier.lookahead": 0, "verifier.trial_values": "model", "model.weights": "dense",
    # arbor's parts, switchable since issue 65: every one on, as arbor always ran before
    "policy.msve": "all", "policy.topology": True, "policy.extract": True, "policy.host_tier": True,
    "policy.pins": ["sinks", "question", "parent"],
}  # fmt: skip


class ConfigMismatch(ValueError):
    """A rerun's config differs from the one that wrote the run dir (and ``resume`` is not force)."""


class RunDirBusy(ValueError):
    """Another live process holds the run dir's lock (it is writing there)."""


class RunDirLock:
    """The exclusive lock of a run dir (``fcntl.flock`` on ``run.lock``): one writer at a time.

    :meth:`acquire` raises :class:`RunDirBusy` naming the holder's pid when another open lock holds
    it (another process, or another run in this one). The lock goes with its process: a killed run
    leaves ``run.lock`` behind, but not the lock. Use as a context manager to release it.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        """Take the lock without waiting, and write this process's pid into the lock file."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirBusy(
                f"run dir {self.path.parent} is in use by pid {holder} (another run writes there); "
                "wait for it to end or pick another run_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the next run in (the pid stays in the file; only a held lock counts)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def __enter__(self) -> RunDirLock:
        return self if self.held else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim(run_dir: Path, cfg: DictConfig, task: Task | None = None, problems: Sequence[Problem] = ()) -> RunDirLock:
    """Lock ``run_dir`` for this run, check that it may add to it (:func:`check_resume`), and clean its
    JSON-lines files for the rerun (see the module docstring). Returns the held lock (release it
    once the run's last row is written); raises :class:`RunDirBusy` or :class:`ConfigMismatch`
    (the lock released) when the run cannot write there."""
    lock = RunDirLock(run_dir).acquire()
    try:
        check_resume(run_dir, cfg, task, problems)
        clean_run_dir(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def clean_run_dir(run_dir: Path) -> None:
    """Torn or corrupt lines of the JSON-lines files to ``<file>.corrupt``; one record per problem;
    events, traces and residency records only of problems with a results row (the others run again)."""
    corrupt, _ = clean_jsonl(run_dir / RESULTS_FILE)
    done = load_done(run_dir)
    for name in (EVENTS_FILE, TRACES_FILE, RESIDENCY_FILE):
        moved, dropped = clean_jsonl(run_dir / name, keep=done.__contains__)
        corrupt += moved
        if dropped:
            log.info("%s: dropped %d records of problems without a results row (they run again)", name, dropped)
    if corrupt:
        log.warning("run dir %s: %d torn or corrupt lines moved to *.jsonl.corrupt", run_dir, corrupt)


def ignored(key: str) -> bool:
    """Whether a flat settings key is one of :data:`IGNORED_KEYS` (or under one)."""
    return any(key == i or key.startswith(i + ".") for i in IGNORED_KEYS)


def fingerprint(cfg: DictConfig) -> tuple[str, dict[str, Any]]:
    """The fingerprint of a composed config (a short sha256) and the flat settings it hashes.

    ``model.weights=auto`` is recorded as the format it picks for this model on this device (what the
    results depend on): a run dir made before the setting existed (float32, ``dense``) resumes where auto
    picks dense, and is refused, naming ``dense -> int4``, where auto picks the GGUF's int4."""
    flat = _flatten(OmegaConf.to_container(cfg, resolve=True))
    kept = {k: v for k, v in flat.items() if not ignored(k)}
    if kept.get("model.weights") == "auto":
        kept["model.weights"] = _auto_weights(kept)
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return digest, kept


def check_resume(run_dir: Path, cfg: DictConfig, task: Task | None = None, problems: Sequence[Problem] = ()) -> None:
    """Refuse (:class:`ConfigMismatch`, one line) when ``run_dir`` cannot take this run; else store
    the config's fingerprint there (with ``task``'s data identity over ``problems``: see the module
    docstring). Call it holding the run dir's lock (:func:`claim` does)."""
    mode = cfg.get("resume", True)
    if mode not in RESUME_MODES:
        raise ValueError(f"resume={mode!r} must be one of true, false, force")
    has_results = (run_dir / RESULTS_FILE).is_file() and (run_dir / RESULTS_FILE).stat().st_size > 0
    if has_results and mode is False:
        raise ConfigMismatch(f"run dir {run_dir} already holds results and resume=false; pick another run_dir")
    digest, settings = fingerprint(cfg)
    stored = read_fingerprint(run_dir)
    if has_results and stored is not None and not same_config(stored, digest, settings) and mode != "force":
        changes = settings_diff(with_added_keys(stored.get("settings", {}), settings), settings)
        raise ConfigMismatch(
            f"run dir {run_dir} holds results of another config ({changes}); rerun with resume=force to add "
            "to it anyway, or pick another run_dir"
        )
    data = data_identity(task, problems) if task is not None else None
    old_data = (stored or {}).get("data") if mode != "force" else None
    if has_results and data is not None and old_data:
        _check_data(run_dir, old_data, data)
        data["rows"] = old_data.get("rows", {}) | data["rows"]  # a widened slice adds its rows' hashes
    record = {"fingerprint": digest, "settings": settings} | ({"data": data} if data is not None else {})
    path = run_dir / FINGERPRINT_FILE
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def _auto_weights(settings: dict[str, Any]) -> str:
    """The format ``model.weights=auto`` picks for the settings' model and device ("auto" when they do not
    name one that resolves: that error is the model loader's to give)."""
    from arbor_runtime.loading import ModelSpecError, auto_weights, resolve_device

    try:
        device = resolve_device(settings.get("model.device"))
        return auto_weights(str(settings["model.spec"]), device, settings.get("model.dtype"))
    except (ModelSpecError, KeyError, OSError, RuntimeError, ValueError):
        return "auto"


def same_config(stored: dict[str, Any], digest: str, settings: dict[str, Any]) -> bool:
    """Whether a stored fingerprint record says what ``digest`` / ``settings`` do: the same digest, or the
    same settings once a key of :data:`ADDED_KEYS` the record predates is read as its old value."""
    if stored["fingerprint"] == digest:
        return True
    old = stored.get("settings")
    if old is None:
        return False
    return as_json(with_added_keys(old, settings)) == as_json(settings)


def with_added_keys(old: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Stored settings ``old`` with each key of :data:`ADDED_KEYS` that ``settings`` has and they predate
    read as its old value, and without the keys a fingerprint no longer records (:data:`IGNORED_KEYS`)."""
    kept = {k: v for k, v in old.items() if not ignored(k)}
    return {k: v for k, v in ADDED_KEYS.items() if k in settings and k not in kept} | kept


def as_json(settings: dict[str, Any]) -> str:
    """Settings as canonical JSON text (sorted keys): two equal settings give the same text."""
    return json.dumps(settings, sort_keys=True, default=str)


def data_identity(task: Task, problems: Sequence[Problem]) -> dict[str, Any]:
    """Where ``task``'s rows came from (its data file, or the hub datasets), the file's size, and a
    short hash of each problem's row (question, answer, meta) by index."""
    source = getattr(task, "data_file", None) or getattr(task, "data_origin", None)
    size = Path(source).stat().st_size if source is not None and Path(source).is_file() else None
    rows = {str(p.index): row_hash(p) for p in problems}
    return {"source": None if source is None else str(source), "size": size, "rows": rows}


def row_hash(problem: Problem) -> str:
    """A short sha256 of what a problem's row says (its index aside)."""
    text = json.dumps([problem.question, problem.answer, problem.meta], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_data(run_dir: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse when the data file's size differs, or when a problem done in ``run_dir`` has another row now."""
    where = f"{old.get('source')} -> {new['source']}" if old.get("source") != new["source"] else str(new["source"])
    advice = "rerun with resume=force to add to it anyway, or pick another run_dir"
    if old.get("size") != new["size"]:
        raise ConfigMismatch(
            f"run dir {run_dir} holds results of another data file ({where}: {old.get('size')} -> "
            f"{new['size']} bytes); {advice}"
        )
    done = load_done(run_dir)
    changed = sorted(
        int(i) for i, h in new["rows"].items() if int(i) in done and old.get("rows", {}).get(i, h) != h
    )  # fmt: skip
    if changed:
        shown = ", ".join(map(str, changed[:3])) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise ConfigMismatch(
            f"run dir {run_dir} holds results of other rows (data {where}: the row of problem {shown} "
            f"done there differs); {advice}"
        )


def read_fingerprint(run_dir: Path) -> dict[str, Any] | None:
    """A run dir's stored fingerprint record (None when it has none); ValueError naming the file when it
    is not one (cut short, not JSON, not an object with a fingerprint)."""
    path = Path(run_dir) / FINGERPRINT_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(
            f"{path}: not a readable fingerprint record ({why}); delete it or pick another run_dir"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("fingerprint"), str):
        raise ValueError(f'{path}: not a fingerprint record (no "fingerprint"); delete it or pick another run_dir')
    return record


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested settings as one level of dotted keys ("controller.n_generate")."""
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}{key}."))
    return out


def settings_diff(old: dict[str, Any], new: dict[str, Any], limit: int = 3) -> str:
    """The first few settings that differ, as ``key: old -> new``."""
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    shown = [f"{k}: {json.dumps(old.get(k))} -> {json.dumps(new.get(k))}" for k in keys[:limit]]
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(shown) + more
