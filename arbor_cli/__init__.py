"""Command-line edge of the project: Hydra entry points, progress, tables, result files."""

import os

# OpenMP threads that busy-wait between parallel regions (libgomp's default) make small CPU ops
# 10-30x slower on a machine whose cores are also busy with other work (measured here: 2,000 small
# linears took 17 s spinning vs 0.6 s passive). Set before torch loads OpenMP; a user's own
# OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A source checkout run without installing it (the repository on PYTHONPATH): conf/, which
# pyproject.toml installs as arbor_cli.conf, is this package's sibling, so subpackages are looked up
# there too (see arbor_runtime/__init__.py). An installed wheel has no pyproject.toml beside it.
_checkout = os.path.dirname(__path__[0])
if all(os.path.exists(f"{_checkout}/{n}") for n in ("pyproject.toml", "conf/__init__.py")):
    __path__.append(_checkout)
del _checkout


def _register_resolvers() -> None:
    """``${arbor.or:a,b}``: ``a`` unless it is null, else ``b``. conf/config.yaml uses it so a run given
    ``run_dir=`` keeps Hydra's own files (.hydra/, solve.log) there too instead of under outputs/."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("arbor.or"):
        OmegaConf.register_new_resolver("arbor.or", lambda a, b: b if a is None else a)


_register_resolvers()
