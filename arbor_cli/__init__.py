"""Command-line edge of the project: Hydra entry points, progress, tables, result files."""

import os

# OpenMP threads that busy-wait between parallel regions (libgomp's default) make small CPU ops
# 10-30x slower on a machine whose cores are also busy with other work (measured here: 2,000 small
# linears took 17 s spinning vs 0.6 s passive). Set before torch loads OpenMP; a user's own
# OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
