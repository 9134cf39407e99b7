"""Boolean switches of ``arbor-solve``'s config: every one is read the same way, before any work.

Hydra reads ``true``/``false`` as booleans but leaves ``view=off`` or ``save_trees=no`` a string, which
Python treats as true: the switch would do the opposite of what it says. Every switch is therefore
parsed here, one way: ``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off`` (any case), and
anything else is refused in one line naming the key and the spellings. ``resume`` takes the same words
or ``force``.

The switches are the keys whose shipped value is a boolean (:func:`switch_keys`, read from the yaml
files of ``conf/``: a switch added there is covered without a change here). A group key counts
wherever any of the group's options ships it as a boolean (``controller.release_pruned``).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")
SPELLINGS = "true/false, 1/0, yes/no or on/off (any case)"
#: the top-level key that takes a switch's words or ``force``
RESUME = "resume"


def parse_switch(value: Any, key: str) -> bool:
    """``value`` of the switch ``key`` as a bool; ValueError naming both when it spells neither."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise ValueError(f"{key}={value!r} is not a switch; valid: {SPELLINGS}")


def parse_resume(value: Any) -> bool | str:
    """``resume``: a switch's words, or ``force`` (any case)."""
    if isinstance(value, str) and value.strip().lower() == "force":
        return "force"
    try:
        return parse_switch(value, RESUME)
    except ValueError:
        raise ValueError(f"resume={value!r} is not a resume mode; valid: {SPELLINGS}, or force") from None


@cache
def switch_keys() -> tuple[str, ...]:
    """Dotted keys whose value some shipped config gives as a boolean (``view``, ``model.trust_remote_code``)."""
    root = resources.files("arbor_cli.conf")
    found = set(_bool_leaves(_yaml(root.joinpath("config.yaml"))))
    for group in root.iterdir():
        if not group.is_dir() or group.name.startswith(("_", "experiment", "hydra")):
            continue
        for option in group.iterdir():
            if option.name.endswith(".yaml"):
                found.update(f"{group.name}.{key}" for key in _bool_leaves(_yaml(option)))
    return tuple(sorted(found - {RESUME}))


def normalize_switches(cfg: DictConfig) -> DictConfig:
    """Every switch of ``cfg`` as a real bool (``resume`` also ``"force"``), in place; ValueError, one
    line naming the key and the valid spellings, on the first that spells neither. Returns ``cfg``."""
    with open_dict(cfg):
        for key in switch_keys():
            value = OmegaConf.select(cfg, key, default=None)
            if value is not None:
                OmegaConf.update(cfg, key, parse_switch(value, key), merge=False)
        if RESUME in cfg:
            cfg[RESUME] = parse_resume(cfg[RESUME])
    return cfg


def _yaml(path) -> dict[str, Any]:
    data = OmegaConf.to_container(OmegaConf.create(path.read_text() or "{}"), resolve=False)
    return {k: v for k, v in data.items() if k != "defaults"}


def _bool_leaves(node: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of ``node``'s boolean leaves (the ``hydra`` node left out: Hydra reads its own)."""
    found = []
    for key, value in node.items():
        if key == "hydra" and not prefix:
            continue
        if isinstance(value, bool):
            found.append(prefix + str(key))
        elif isinstance(value, dict):
            found += _bool_leaves(value, f"{prefix}{key}.")
    return found
