"""`arbor-solve`: the Hydra entry point; all work happens in :func:`arbor_cli.run.run`.

An unknown option of a config group (``policy=lru``) is reported in one line naming the value and
the valid ones, exit 2, before Hydra composes anything (Hydra's own report lists its search path). An
override Hydra cannot apply (a misspelt key, ``polcy.budget_tokens=500``; a value its grammar refuses)
is reported the same way: the command's overrides are composed once first (the first value of each
sweep), and a failure is one line naming the override and, for an unknown key, the keys that exist
there (Hydra's own report is several lines and exits 1).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from importlib import resources

import hydra
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from arbor_cli.run import run, run_dir_error
from arbor_cli.switches import normalize_switches

#: config groups whose options are files conf/<group>/<option>.yaml
GROUPS = ("task", "policy", "controller", "verifier", "model", "runner", "experiment")


def group_options(group: str) -> list[str]:
    """The options of a config group (``experiment`` options in subfolders as ``folder/name``)."""
    root = resources.files("arbor_cli.conf").joinpath(group)
    found = []
    for entry in root.iterdir():
        if entry.name.endswith(".yaml"):
            found.append(entry.name[: -len(".yaml")])
        elif entry.is_dir() and not entry.name.startswith("_"):
            found += [f"{entry.name}/{sub.name[:-5]}" for sub in entry.iterdir() if sub.name.endswith(".yaml")]
    return sorted(found)


def check_choices(argv: Sequence[str]) -> str | None:
    """The first ``group=option`` override naming no option of its group, as an error line (or None).

    Sweep lists (``policy=full,arbor``) are checked item by item; sweeper functions (``choice(...)``,
    ``glob(...)``) and interpolations are left to Hydra."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key.lstrip("+") not in GROUPS or any(c in value for c in "()${}*"):
            continue
        group = key.lstrip("+")
        options = group_options(group)
        for option in value.split(","):
            if option not in options:
                return f"{group}={option!r} is not an option of {group}; valid: {', '.join(options)}"
    return None


#: command-line flags check_overrides composes through (any other flag, ``--config-dir`` or ``--cfg``
#: say, changes what is composed: Hydra alone judges those commands)
PLAIN_FLAGS = ("-m", "--multirun")
#: Hydra's words for an override naming no key of the config
UNKNOWN_KEY = re.compile(r"Could not override '([^']+)'")


def _first_value(override: Override) -> str:
    """The override as one run applies it: a sweep (``a=1,2``, ``range(0,3)``) by its first value."""
    if not override.is_sweep_override():
        return override.input_line
    return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"


def _compose(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """The config ``arbor-solve`` would run with these overrides (``with_hydra``: with its hydra node)."""
    with initialize_config_module(version_base="1.3", config_module="arbor_cli.conf"):
        return compose("config", overrides=list(overrides), return_hydra_config=with_hydra)


def _one_line(exc: BaseException) -> str:
    """An exception's message (and its cause's first line) as one line."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip() and "hydra.cc/docs" not in line)
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text += f" ({str(cause).strip().splitlines()[0]})"
    return text


def _unknown_key(key: str, parsed: Sequence[tuple[str, str, str]]) -> str:
    """The line for an override of a key the config lacks: where its path leaves the config and the
    keys that exist there (the config composed without that override). ``parsed``: (as typed, as
    applied, key) per override."""
    line = next((typed for typed, _, k in parsed if k == key), key)
    cfg = _compose([applied for _, applied, k in parsed if k != key], with_hydra=key.startswith("hydra."))
    node, where = cfg, ""
    for part in key.split("."):
        if not OmegaConf.is_dict(node) or part not in node:
            break
        node, where = node[part], f"{where}.{part}".lstrip(".")
    if not OmegaConf.is_dict(node):
        return f"{line}: {where} is a value ({node!r}), not a group of keys"
    keys = ", ".join(sorted(map(str, node)))
    return f"{line}: {where or 'the config'} has no key {part!r}; valid: {keys} (+{line} would add it)"


def check_overrides(argv: Sequence[str]) -> str | None:
    """The first override Hydra cannot parse or apply, as an error line (or None).

    The overrides are composed as the first run of the command would be; commands with flags that
    change what is composed (other than ``-m``) are left to Hydra, as are sweeps with no first value
    (an ``interval``)."""
    if any(a.startswith("-") and a not in PLAIN_FLAGS for a in argv):
        return None
    parser = OverridesParser.create()
    parsed: list[tuple[str, str, str]] = []  # (as typed, as the first run applies it, its key or group)
    for line in (a for a in argv if a not in PLAIN_FLAGS):
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException as exc:
            return f"{_shown(line)}: {_parse_error(line, exc)}"
        except ValueError as exc:  # Python's own refusals while parsing (a 5,000-digit integer)
            return f"{_shown(line)}: {_one_line(exc).split(';')[0]}; valid: key=value with a value Hydra can read"
        if not override.key_or_group:
            return f"{_shown(line)}: an override needs a key before '='; valid: key=value (seed=5)"
        try:
            parsed.append((line, _first_value(override), override.key_or_group))
        except (HydraException, StopIteration):
            return None
    try:
        cfg = _compose([applied for _, applied, _ in parsed])
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        found = UNKNOWN_KEY.match(str(exc))
        return _unknown_key(found.group(1), parsed) if found else _one_line(exc)
    try:
        normalize_switches(cfg)  # view=maybe: refused here, before Hydra makes a run dir
    except ValueError as exc:
        return str(exc)
    if cfg.get("run_dir") is not None:
        return run_dir_error(cfg.run_dir)
    return run_dir_error(cfg.paths.output_dir, "paths.output_dir")  # Hydra makes the run's folder under it


def _shown(line: str, limit: int = 80) -> str:
    """An override as an error line shows it: at most ``limit`` characters (a 5,000-digit seed is cut)."""
    return line if len(line) <= limit else f"{line[:limit]}... ({len(line):,} characters)"


def _parse_error(line: str, exc: HydraException) -> str:
    """Why Hydra's grammar refuses an override, in words: an unquoted non-ASCII value says to quote it."""
    key, sep, value = line.partition("=")
    if sep and not value.isascii() and "'" not in value and '"' not in value:
        return f"Hydra reads only ASCII characters in an unquoted value; valid: quote it, {key}='{value}'"
    return _one_line(exc)


@hydra.main(version_base="1.3", config_path="pkg://arbor_cli.conf", config_name="config")
def _solve(cfg: DictConfig) -> None:
    code = run(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    error = check_choices(sys.argv[1:]) or check_overrides(sys.argv[1:])
    if error:
        print(f"arbor-solve: error: {error}", file=sys.stderr)
        sys.exit(2)
    _solve()


if __name__ == "__main__":
    main()
