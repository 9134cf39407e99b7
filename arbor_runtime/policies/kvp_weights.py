"""KVP scorer weights on disk: one safetensors file per model, matched to the model by fingerprint.

A weights file holds the stacked parameters of a :class:`KVPScorer` and string metadata: the
format tag, the scorer geometry, the model fingerprint and a JSON record of how it was trained.
Files shipped in ``arbor_runtime/policies/weights/`` are found by the fingerprint of the model
in use; a file for another model is refused with a message naming both.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from arbor_runtime.policies.kvp_scorer import FEATURES, KVPScorer, ScorerShape

FORMAT = "arborkv-kvp/1"
WEIGHTS_DIR = Path(__file__).with_name("weights")
_PROBE_VALUES = 4096


class KVPWeightsError(ValueError):
    """A KVP weights file is missing, malformed, or made for another model."""


def model_fingerprint(model: torch.nn.Module) -> str:
    """A short hash identifying a model: its KV geometry and a probe of its first key projection.

    The probe is the sign pattern of the first 4096 weights of the first ``k_proj`` (or of the
    first parameter): signs survive a cast, so the same weights loaded in float32, float16 or
    bfloat16 agree (a rounded value would not: a double rounding moves some values), while two
    different weight sets differ in about half of those signs.
    """
    known = getattr(model, "arbor_fingerprint", None)  # set before its weights were quantized (load_model)
    if known is not None:
        return known
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    geometry = {
        "layers": cfg.num_hidden_layers,
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        "head_dim": head_dim,
        "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size,
    }
    params = dict(model.named_parameters())
    name = next((n for n in params if n.endswith("k_proj.weight")), next(iter(params)))
    probe = (params[name].detach().flatten()[:_PROBE_VALUES] < 0).to("cpu", torch.uint8)
    digest = hashlib.sha256(json.dumps(geometry, sort_keys=True).encode())
    digest.update(probe.numpy().tobytes())
    return digest.hexdigest()[:16]


def scorer_shape_of(model: torch.nn.Module, embed: int = 32, hidden: int = 32) -> ScorerShape:
    """The scorer geometry that fits ``model`` (one head per layer and KV head)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return ScorerShape(cfg.num_hidden_layers, kv_heads, head_dim, embed, hidden)


def save_weights(path: str | Path, scorer: KVPScorer, fingerprint: str, info: dict[str, Any]) -> Path:
    """Write ``scorer`` with its model fingerprint and a JSON-able ``info`` record (training run)."""
    s = scorer.shape
    meta = {
        "format": FORMAT,
        "model_fingerprint": fingerprint,
        "shape": json.dumps(
            {"layers": s.layers, "kv_heads": s.kv_heads, "head_dim": s.head_dim, "embed": s.embed, "hidden": s.hidden}
        ),
        "features": json.dumps(FEATURES),
        "info": json.dumps(info),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous().float() for k, v in scorer.state_dict().items()}
    save_file(tensors, str(path), metadata=meta)
    return path


@dataclass(frozen=True, slots=True)
class LoadedWeights:
    """A scorer read from ``path``, the fingerprint of the model it was trained for, its info record."""

    scorer: KVPScorer
    fingerprint: str
    info: dict[str, Any]
    path: Path


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a weights file (raises :class:`KVPWeightsError` when it is not one)."""
    path = Path(path)
    if not path.is_file():
        raise KVPWeightsError(f"KVP weights file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types for a corrupt header
        raise KVPWeightsError(f"{path} is not a safetensors file ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise KVPWeightsError(f"{path} is not a KVP weights file (format {meta.get('format')!r}, want {FORMAT!r})")
    return meta


def load_weights(path: str | Path, fingerprint: str | None = None) -> LoadedWeights:
    """Read a weights file; with ``fingerprint``, refuse weights trained for another model."""
    path = Path(path)
    meta = read_metadata(path)
    if fingerprint is not None and meta["model_fingerprint"] != fingerprint:
        raise KVPWeightsError(
            f"KVP weights {path} were trained for model fingerprint {meta['model_fingerprint']}, but the model in "
            f"use has fingerprint {fingerprint}; train weights for this model with scripts/kvp_collect.py and "
            f"scripts/kvp_train.py, or pass the matching weights file"
        )
    if json.loads(meta["features"]) != list(FEATURES):
        raise KVPWeightsError(f"{path} uses features {meta['features']}, this code computes {list(FEATURES)}")
    scorer = KVPScorer(ScorerShape(**json.loads(meta["shape"])))
    with safe_open(str(path), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    scorer.load_state_dict(state)
    return LoadedWeights(scorer.eval().requires_grad_(False), meta["model_fingerprint"], json.loads(meta["info"]), path)


def shipped_weights(fingerprint: str) -> Path:
    """The weights file shipped with the package for the model with ``fingerprint``."""
    found = {}
    for path in sorted(WEIGHTS_DIR.glob("kvp-*.safetensors")):
        found[read_metadata(path)["model_fingerprint"]] = path
    if fingerprint not in found:
        shipped = ", ".join(f"{p.name} ({fp})" for fp, p in found.items()) or "none"
        raise KVPWeightsError(
            f"no KVP weights shipped for the model with fingerprint {fingerprint} (shipped: {shipped}); "
            f"train them with scripts/kvp_collect.py and scripts/kvp_train.py and pass policy.weights=PATH"
        )
    return found[fingerprint]
