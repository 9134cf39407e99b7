"""Command-line edge of the project: Hydra entry points, progress, tables, result files."""
