"""MSVE: multi-signal value estimation of a thought block (ArborKV).

A block's value combines its search value (set by the verifier through ``Runtime.set_value``),
its uncertainty (mean token entropy, normalized by log|V|), its attention density (mean
attention per token and per observing query, relative to the mean over all blocks), and its depth:

    value = sigmoid(bias + w_search * s + w_uncertainty * u + w_attention * a + w_depth * d)

Weights come from a calibration file written by ``scripts/calibrate_msve.py`` (JSON); without
one, :data:`DEFAULT_WEIGHTS` apply: search value dominates, uncertain blocks are worth less,
attended blocks more.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from arbor_runtime.policies.base import BlockView
from arbor_runtime.tree import Node

#: the signal names, in the order the calibration fits them
SIGNALS = ("search", "uncertainty", "attention", "depth")
#: calibration shipped with the package (written by scripts/calibrate_msve.py on SmolLM2)
DEFAULT_CALIBRATION = Path(__file__).with_name("msve_calibration.json")


@dataclass(frozen=True, slots=True)
class MSVEWeights:
    """Weights of the MSVE signals (see module docstring)."""

    bias: float = 0.0
    search: float = 3.0
    uncertainty: float = -1.0
    attention: float = 2.0
    depth: float = -0.1

    @classmethod
    def load(cls, path: str | Path | None) -> MSVEWeights:
        """Weights from a calibration JSON (``{"weights": {...}}``).

        ``path=None`` takes the calibration shipped with the package, or the class defaults when
        there is none.
        """
        if path is None:
            return cls.load(DEFAULT_CALIBRATION) if DEFAULT_CALIBRATION.is_file() else cls()
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"MSVE calibration file {str(path)!r} does not exist (policy.calibration)")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:  # cut short, binary, a folder
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ValueError(
                f"MSVE calibration file {str(path)!r} is not readable JSON ({why}) (policy.calibration)"
            ) from None
        weights = data.get("weights", data) if isinstance(data, dict) else None
        if not isinstance(weights, dict):
            raise ValueError(
                f'MSVE calibration file {str(path)!r} holds no {{"weights": {{...}}}} object (policy.calibration)'
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(weights) - known)
        if unknown:
            raise ValueError(f"calibration {path}: unknown weights {unknown}; valid: {sorted(known)}")
        bad = next((k for k, v in weights.items() if isinstance(v, bool) or not isinstance(v, int | float)), None)
        if bad is not None:
            raise ValueError(f"calibration {path}: weight {bad}={weights[bad]!r} is not a number")
        return cls(**{k: float(v) for k, v in weights.items()})

    @classmethod
    def alone(cls, path: str | Path | None, signal: str) -> MSVEWeights:
        """The weights of ``signal`` fitted alone, as the calibration file's ``single`` holds them
        (``scripts/calibrate_msve.py`` writes it); a file without it: its weights :meth:`only` that signal."""
        weights = cls.load(path).only(signal)
        path = DEFAULT_CALIBRATION if path is None else Path(path).expanduser()
        if not path.is_file():
            return weights
        single = json.loads(path.read_text()).get("single") or {}
        fitted = single.get(signal) if isinstance(single, dict) else None
        if not isinstance(fitted, dict):
            return weights
        return cls.only(cls(**{k: float(v) for k, v in fitted.items() if k in ("bias", signal)}), signal)

    def only(self, signal: str | None) -> MSVEWeights:
        """The same calibration reading one signal of :data:`SIGNALS` (the others' weights 0); ``None``:
        no signal (every block the same value, ``sigmoid(bias)``)."""
        if signal is not None and signal not in SIGNALS:
            raise ValueError(f"MSVE signal {signal!r}; valid: {', '.join(SIGNALS)}")
        return replace(self, **{s: getattr(self, s) if s == signal else 0.0 for s in SIGNALS})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def unit_value(value: float) -> float:
    """``value`` clamped to [0, 1]; a non-finite value (NaN set on ``node.value`` directly) counts as 0."""
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


def search_value(node: Node) -> float:
    """The node's own value, else the best value among its children (a thought's forced block holds
    the verifier score), else its parent's, else 0.5."""
    if node.value is not None:
        return node.value
    child_values = [c.value for c in node.children if c.value is not None]
    if child_values:
        return max(child_values)
    if node.parent is not None and node.parent.value is not None:
        return node.parent.value
    return 0.5


def attention_per_query(b: BlockView) -> float:
    """Mean attention a token of the block received per query that could see it.

    Accumulated attention alone grows with a block's age (more later queries); dividing by the
    queries that observed it keeps old blocks from looking important just for being old.
    """
    return float(b.kv.attention.sum()) / max(b.kv.length, 1) / max(b.kv.observers, 1.0)


def signals(blocks: list[BlockView], vocab_size: int) -> dict[int, tuple[float, float, float, float]]:
    """Per block id, the (search, uncertainty, attention, depth) signals, each roughly in [0, 1]."""
    densities = {b.node.id: attention_per_query(b) for b in blocks}
    mean_density = sum(densities.values()) / max(len(densities), 1) or 1.0
    log_v = math.log(max(vocab_size, 2))
    out = {}
    for b in blocks:
        ratio = densities[b.node.id] / mean_density
        out[b.node.id] = (
            unit_value(search_value(b.node)),
            min(b.node.mean_entropy / log_v, 1.0),
            ratio / (1.0 + ratio),
            min(b.node.depth / 10.0, 1.0),
        )
    return out


def block_values(blocks: list[BlockView], weights: MSVEWeights, vocab_size: int) -> dict[int, float]:
    """MSVE value in (0, 1) per block id."""
    w = (weights.search, weights.uncertainty, weights.attention, weights.depth)
    values = {}
    for node_id, sig in signals(blocks, vocab_size).items():
        z = weights.bias + sum(wi * si for wi, si in zip(w, sig, strict=True))
        values[node_id] = 1.0 / (1.0 + math.exp(-z))
    return values
