"""`arbor-solve`: the Hydra entry point; all work happens in :func:`arbor_cli.run.run`."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from arbor_cli.run import run


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
def main(cfg: DictConfig) -> None:
    code = run(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
