"""`arbor-solve`: the Hydra entry point; all work happens in :func:`arbor_cli.run.run`.

An unknown option of a config group (``policy=lru``) is reported in one line naming the value and
the valid ones, exit 2, before Hydra composes anything (Hydra's own report lists its search path).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import resources

import hydra
from omegaconf import DictConfig

from arbor_cli.run import run

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


@hydra.main(version_base="1.3", config_path="pkg://arbor_cli.conf", config_name="config")
def _solve(cfg: DictConfig) -> None:
    code = run(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    error = check_choices(sys.argv[1:])
    if error:
        print(f"arbor-solve: error: {error}", file=sys.stderr)
        sys.exit(2)
    _solve()


if __name__ == "__main__":
    main()
