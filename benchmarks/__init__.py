"""Benchmarks: outside the installed package; they import arbor_runtime like a user would."""
