"""The run the viewer tests read (tests/test_view*.py): a tiny-model arbor-solve whose budget sends blocks to the host.

Made once per test session (both modules share it) under pytest's base temp dir; the viewer's
residency states are re-derived here in Python (what viewer.js colours), so the tests can say
which blocks must change colour at a step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from arbor_cli.build import compose_config
from arbor_cli.residency import replay
from arbor_cli.run import run

#: game24 rows 900-901, ToT BFS with legal-move proposals, ArborKV at 600 tokens (the prompts are
#: ~140 tokens; an LLM-value prompt tree takes ~240 more), so later steps evict to the host tier
OVERRIDES = (
    "model=tiny-random", "policy=arbor", "policy.budget_tokens=600", "task.end=902", "task.propose=legal",
    "task.n_shots=1", "controller.n_generate=5", "controller.breadth=3", "view=true",
)  # fmt: skip
CONSOLE_FILE = "console.txt"


def tiny_view_run(base: Path, data_dir: Path, *extra: str, name: str = "view-run") -> Path:
    """The run dir of ``OVERRIDES`` (+ ``extra``) under ``base``, run on first use; its console
    output is kept in ``console.txt``."""
    run_dir = Path(base) / name
    if not (run_dir / CONSOLE_FILE).is_file():
        console = Console(record=True, width=200)
        cfg = compose_config([*OVERRIDES, f"paths.data_dir={data_dir}", f"run_dir={run_dir}", *extra])
        assert run(cfg, console=console) == 0
        (run_dir / CONSOLE_FILE).write_text(console.export_text())
    return run_dir


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def by_index(path: Path) -> dict[int, dict[str, Any]]:
    return {row["index"]: row for row in jsonl(path)}


def block_states(tree: dict[str, Any], residency: dict[str, Any], trace: list[dict]) -> list[dict[int, str]]:
    """Per trace point, every node's residency state as viewer.js names it: future (no KV yet),
    released, shared (whole on device with 2+ live children), whole, partial, host, dropped."""
    steps = [p["step"] for p in trace]
    states = replay(residency, steps)
    released_at: dict[int, int] = {}
    for step, node, *_, op, _ in residency["deltas"]:
        if "release" in op:
            released_at.setdefault(node, step)
    kids: dict[int, list[int]] = {}
    for n in tree["nodes"]:
        kids.setdefault(n["parent"], []).append(n["id"])
    out = []
    for step, state in zip(steps, states, strict=True):
        live = {i for i in state if released_at.get(i, step + 1) > step}
        names = {}
        for n in tree["nodes"]:
            names[n["id"]] = _state(n["id"], state, live, kids, released_at, step)
        out.append(names)
    return out


def _state(node: int, state, live, kids, released_at, step) -> str:
    if node not in state:
        return "future"
    if released_at.get(node, step + 1) <= step:
        return "released"
    device, host, dropped = state[node]
    if device > 0 and host == 0 and dropped == 0:
        return "shared" if sum(k in live for k in kids.get(node, [])) >= 2 else "whole"
    if device > 0:
        return "partial"
    return "host" if host > 0 else "dropped"
