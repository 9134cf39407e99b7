"""Errors of the runners."""

from __future__ import annotations

from arbor_runtime import ArborError


class RunnerError(ArborError):
    """A runner cannot run at all (its optional extra is missing, its cluster cannot be reached,
    none of its workers could start): reported as one line, exit code 2."""
