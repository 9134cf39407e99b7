"""Merging run dirs of one config that ran different problems (shards of a slice run side by side).

A slice split by ``task.start`` / ``task.end`` over several processes or machines writes one run dir
per shard; :func:`merge_runs` adds each shard's finished problems to the first run dir, so the
first becomes the run of the whole slice (``policy.budget_reference`` and the benchmarks read one run
dir). Every shard must have been written by the same config (the fingerprint of
:mod:`arbor_cli.resume`) over the same data file; a problem the target already holds is kept as it
is (merging twice adds nothing), and a problem without a results row in its shard is left out with
its records. The target is locked while it is written (:class:`~arbor_cli.resume.RunDirLock`).

    python scripts/merge_runs.py TARGET_RUN_DIR SHARD_RUN_DIR [SHARD_RUN_DIR ...]
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from arbor_cli.residency import RESIDENCY_FILE
from arbor_cli.results import (
    CSV_FILE,
    EVENTS_FILE,
    RESULTS_FILE,
    TRACES_FILE,
    TREES_DIR,
    load_done,
    read_jsonl,
    write_csv,
)
from arbor_cli.resume import FINGERPRINT_FILE, ConfigMismatch, RunDirLock, settings_diff

#: the per-problem JSON-lines files of a run dir, results last (a problem is done once its row is)
RECORD_FILES = (EVENTS_FILE, TRACES_FILE, RESIDENCY_FILE, RESULTS_FILE)


def merge_runs(target: Path, shards: Sequence[Path]) -> list[int]:
    """Add every shard's finished problems that ``target`` lacks to ``target`` (records, trees, the
    data rows' hashes of the fingerprint; ``results.csv`` rewritten); returns the indexes added.
    Raises :class:`ConfigMismatch` (nothing written) when a shard's config or data file differs
    from the target's, and FileNotFoundError when a dir is not a run dir."""
    target = Path(target)
    _fingerprint(target)  # not a run dir: refused before the lock file is created there
    with RunDirLock(target):
        stored = _fingerprint(target)  # read under the lock: no run changes it meanwhile
        done = set(load_done(target))
        plans = []
        for shard in map(Path, shards):
            theirs = _fingerprint(shard)
            _check_same(target, stored, shard, theirs)
            new = set(load_done(shard)) - done
            done |= new
            plans.append((shard, theirs, new))
        added = []
        for shard, theirs, new in plans:
            _copy_problems(shard, target, new)
            rows = stored.setdefault("data", {}).setdefault("rows", {})
            rows.update({i: h for i, h in theirs.get("data", {}).get("rows", {}).items() if int(i) in new})
            added += new
        (target / FINGERPRINT_FILE).write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        write_csv(target / CSV_FILE, sorted(load_done(target).values(), key=lambda r: r["index"]))
    return sorted(added)


def _fingerprint(run_dir: Path) -> dict:
    path = run_dir / FINGERPRINT_FILE
    if not (run_dir / RESULTS_FILE).is_file() or not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run dir of arbor-solve (no {RESULTS_FILE} and {FINGERPRINT_FILE})")
    return json.loads(path.read_text())


def _check_same(target: Path, ours: dict, shard: Path, theirs: dict) -> None:
    """Refuse a shard written by another config or from another data file than the target."""
    if theirs["fingerprint"] != ours["fingerprint"]:
        changes = settings_diff(ours.get("settings", {}), theirs.get("settings", {}))
        raise ConfigMismatch(f"{shard} was run with another config than {target} ({changes}); not merged")
    a, b = ours.get("data") or {}, theirs.get("data") or {}
    if a.get("size") != b.get("size"):
        raise ConfigMismatch(f"{shard} read another data file than {target} ({b.get('size')} vs {a.get('size')} bytes)")
    clash = sorted(i for i, h in b.get("rows", {}).items() if a.get("rows", {}).get(i, h) != h)
    if clash:
        raise ConfigMismatch(f"{shard} read other rows than {target} for problems {', '.join(clash[:3])}; not merged")


def _copy_problems(shard: Path, target: Path, indexes: set[int]) -> None:
    """The shard's records of ``indexes`` appended to the target's files (results last), and their trees."""
    trees = shard / TREES_DIR
    if trees.is_dir():
        (target / TREES_DIR).mkdir(exist_ok=True)
        for path in trees.iterdir():
            if path.stem.isdigit() and int(path.stem) in indexes:
                shutil.copy2(path, target / TREES_DIR / path.name)
    for name in RECORD_FILES:
        records = [r for r in read_jsonl(shard / name) if r.get("index") in indexes]
        if records:
            with (target / name).open("a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(r, default=str) + "\n" for r in records))
