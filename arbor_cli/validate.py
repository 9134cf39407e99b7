"""The whole composed config checked before the model loads, in one place (:func:`validate_config`).

Task, verifier and policy settings are checked by building them (their constructors refuse bad
values, for API users too) before this runs; the runner by :func:`arbor_cli.runners.build_runner`.
What is left needs no model, only the config and the machine: the top-level settings, the
controller's (its class checks them without a runtime), the model files (read, not loaded), KVP
weights against the model, and resource requests against the machine's memory. Each failure is
one ValueError naming the value and what is valid; ``arbor-solve`` prints it as one line, exit 2.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from arbor_cli.budget import PolicyFactory
from arbor_runtime import ModelSpecError
from arbor_runtime.controllers.base import Controller
from arbor_runtime.kv.pool import check_pool_fits
from arbor_runtime.loading import ModelGeometry, default_cache_dir, inspect_model, resolve_device

#: policy settings that count tokens of a host tier or an index: an integer >= 0, or null
COUNT_KEYS = ("host_budget_tokens",)


def validate_config(cfg: DictConfig, policies: PolicyFactory, device: str | None = None) -> ModelGeometry:
    """Refuse a config that cannot run (ValueError / ModelSpecError), in well under a second.

    ``device`` is where the model will load (default: ``cfg.model.device``, else cuda when present).
    Returns what the model files say (KV bytes per token), read without loading weights.
    """
    check_seed(cfg.get("seed", 0))
    check_controller(cfg.controller)
    check_policy_counts(policies.node)
    try:
        device = resolve_device(device or cfg.model.get("device"))
    except ModelSpecError as exc:
        raise ModelSpecError(f"model.{exc}") from None
    geometry = check_model_files(cfg.model.spec, device, cfg.model.get("dtype"), cfg.model.get("weights") or "dense")
    check_kvp_weights(policies.node, cfg.model.spec)
    check_dense_layers(policies.node, geometry, cfg.model.spec)
    budget = policies.node.get("budget_tokens")
    if budget is not None:
        check_budget_fits(budget, geometry, device)
    return geometry


#: what a model's config must say for its KV geometry to be known
GEOMETRY_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size")


def check_model_files(spec: str, device: str, dtype: str | None, weights: str = "dense") -> ModelGeometry:
    """:func:`inspect_model`, a config that lacks a key the KV geometry needs named in one line; a weight format
    the device cannot run, or a dtype beside it, refused as ``model.weights``."""
    try:
        return inspect_model(spec, device=device, dtype=dtype, weights=weights)
    except ValueError as exc:
        if str(exc).startswith(("weights=", "dtype=")):
            raise ValueError(f"model.{exc}") from None
        raise
    except KeyError as exc:
        raise ModelSpecError(
            f"model.spec={spec}: its config has no {exc.args[0]!r}; valid: a config.json that states "
            f"{', '.join(GEOMETRY_KEYS)} (and num_key_value_heads, head_dim when they differ)"
        ) from None


def check_seed(seed: Any) -> None:
    """``seed``: an integer (each problem's runtime seed is ``seed`` + its index)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed={seed!r} must be an integer (each problem's runtime seed is seed + its index)")


def check_controller(node: DictConfig) -> None:
    """The controller's settings, checked by its class (``check_params``) without a runtime."""
    params = OmegaConf.to_container(node, resolve=True)
    target = params.pop("_target_")
    cls = get_class(target)
    if issubclass(cls, Controller):
        if cls.check_own.__func__ is Controller.check_own.__func__:  # a user's controller: its own keys unchecked
            params = {k: v for k, v in params.items() if k in inspect.signature(Controller.check_params).parameters}
        try:
            cls.check_params(**params)
        except ValueError as exc:
            raise ValueError(f"controller.{exc}") from None
        except TypeError as exc:  # a key the controller does not take
            raise ValueError(f"controller={cls.name}: {exc}") from None


def check_policy_counts(node: dict[str, Any]) -> None:
    """Token counts of other tiers (``host_budget_tokens``, also inside ``memory_args``): >= 0 or null."""
    for where, args in (("policy", node), ("policy.memory_args", node.get("memory_args") or {})):
        for key in COUNT_KEYS:
            value = args.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(
                    f"{where}.{key}={value!r} must be an integer >= 0 (tokens the host tier may hold) or null "
                    "(half the host memory available)"
                )


def check_kvp_weights(node: dict[str, Any], spec: str) -> None:
    """KVP weights a policy will read (``weights``, arbor's ``kvp_weights``): a KVP file for this model."""
    from arbor_runtime.policies.kvp_weights import read_metadata, shipped_weights

    wanted = _kvp_paths(node)
    if not wanted:
        return
    fingerprint = _cheap_fingerprint(spec)
    for key, path in wanted:
        if path is None:
            if fingerprint is not None:
                _one_line(lambda: shipped_weights(fingerprint), f"{key}=null")
            continue
        valid = "valid: a KVP weights file (scripts/kvp_train.py writes one), or null for the weights shipped"
        meta = _one_line(lambda path=path: read_metadata(path), f"{key}={path!r}", valid)
        if fingerprint is not None and meta["model_fingerprint"] != fingerprint:
            raise ValueError(
                f"{key}={path!r} holds KVP weights for model fingerprint {meta['model_fingerprint']}, but "
                f"model.spec={spec} has fingerprint {fingerprint}; valid: weights trained for this model "
                "(scripts/kvp_collect.py + scripts/kvp_train.py), or null for the shipped ones"
            )


def check_dense_layers(node: dict[str, Any], geometry: ModelGeometry, spec: str) -> None:
    """A sparse read's ``dense_layers`` (lychee, quest, oracle_topk) names layers the model has: given
    explicitly, or under ``auto`` from the user's calibration file (read now: a broken one is named),
    whose entry for this model, when its files tell which it is, must name layers it has."""
    if "dense_layers" not in node:
        return
    from arbor_runtime.sparse.calibrated import calibration_path, read_calibrations
    from arbor_runtime.sparse.reads import AUTO, dense_layer_set

    value, where = node["dense_layers"], f"policy.dense_layers={node['dense_layers']!r}"
    if value == AUTO:
        path = calibration_path()
        entries = read_calibrations(path)  # ValueError naming the file when it is not one
        fingerprint = _cheap_fingerprint(spec) if entries else None
        entry = entries.get(fingerprint) if fingerprint else None
        layers, where = (entry.layers if entry else ()), f"{path} (its entry for model.spec={spec})"
    else:
        layers = dense_layer_set(value)
    bad = sorted(x for x in layers if x >= geometry.layers)
    if bad:
        raise ValueError(f"{where}: layer {bad[0]} is not a layer of the model; valid: 0..{geometry.layers - 1}")


def check_budget_fits(budget: int, geometry: ModelGeometry, device: str) -> None:
    """A device pool of ``budget`` tokens must fit in the memory free beside the model (it is allocated whole):
    the pool's own check (:func:`~arbor_runtime.kv.pool.check_pool_fits`), before the model takes its share."""
    check_pool_fits(
        budget, geometry.kv_bytes_per_token, device, what="policy.budget_tokens", reserved=geometry.weight_bytes,
        valid=", auto (sized from free memory), or null (no budget)",
    )  # fmt: skip


def _kvp_paths(node: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(config key, weights path or None) for each KVP scorer the policy will load."""
    target = str(node.get("_target_", ""))
    found = []
    if target.endswith("KVPPolicy"):
        found.append(("policy.weights", node.get("weights")))
    if node.get("token_scorer") == "kvp":
        found.append(("policy.kvp_weights", node.get("kvp_weights")))
    memory, args = node.get("memory"), node.get("memory_args") or {}
    if memory == "kvp":
        found.append(("policy.memory_args.weights", args.get("weights")))
    if memory == "arbor" and args.get("token_scorer") == "kvp":
        found.append(("policy.memory_args.kvp_weights", args.get("kvp_weights")))
    return found


def _cheap_fingerprint(spec: str) -> str | None:
    """:func:`model_fingerprint` of the model ``spec`` names, from its files (None: only a load can tell)."""
    from arbor_runtime.policies.kvp_weights import model_fingerprint

    if spec == "tiny-random":
        from arbor_runtime.loading import tiny_random_model

        return model_fingerprint(tiny_random_model())  # tiny: built in milliseconds
    folder = default_cache_dir() / "smollm2-135m-instruct" if spec == "smollm2" else Path(spec).expanduser()
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    return model_fingerprint(_FirstKeyProjection(folder, files))


class _FirstKeyProjection:
    """A stand-in model for :func:`model_fingerprint`: the config and layer 0's ``k_proj`` of a folder."""

    def __init__(self, folder: Path, files: list[Path]) -> None:
        from safetensors import safe_open
        from transformers import AutoConfig

        self.config = AutoConfig.from_pretrained(folder)
        self._param: tuple[str, torch.Tensor] | None = None
        layer = re.compile(r"layers\.(\d+)\..*k_proj\.weight$")
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                keys = sorted((int(m.group(1)), k) for k in f.keys() if (m := layer.search(k)))
                if keys:
                    self._param = (keys[0][1], f.get_tensor(keys[0][1]))
                    break
        if self._param is None:
            raise ModelSpecError(f"{folder} holds no k_proj weight: cannot match KVP weights to it")

    def named_parameters(self):
        yield self._param


def _one_line(call, what: str, valid: str = ""):
    """``call()``, its error re-raised as one ValueError line that names ``what`` (and what is ``valid``)."""
    try:
        return call()
    except (ValueError, OSError) as exc:
        raise ValueError(f"{what}: {exc}" + (f"; {valid}" if valid else "")) from None
