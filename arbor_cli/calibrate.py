"""MSVE calibration runs: record full-retention BFS trees, measure leave-one-out effects, fit.

Game of 24 puzzles outside the evaluation slice (rows before 900) and GSM8K *train* questions.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from rich.progress import Progress

from arbor_runtime import Runtime
from arbor_runtime.calibration import fit_weights, leave_one_out
from arbor_runtime.loading import LoadedModel
from arbor_runtime.policies.base import BlockView
from arbor_runtime.policies.msve import SIGNALS, signals
from controllers.bfs import BFSController
from tasks.base import Task
from verifiers.base import Verifier


def collect(loaded: LoadedModel, task: Task, verifier: Verifier, progress: Progress | None = None, **bfs: Any):
    """Samples (signals, effect) from full-retention BFS trees over the task's problems."""
    samples = []
    problems = task.problems()
    bar = progress.add_task(f"calibrate {task.name}", total=len(problems)) if progress else None
    for problem in problems:
        rt = Runtime(loaded, policy="arbor", seed=problem.index)  # no budget: records attention, evicts nothing
        BFSController(rt, task, verifier, release_pruned=False, **bfs).solve(problem)
        samples += tree_samples(rt)
        if progress:
            progress.advance(bar)
    return samples


def tree_samples(rt: Runtime) -> list[tuple[tuple[float, ...], float]]:
    """For every leaf, the leave-one-out effect of each inner block with that block's signals."""
    views = [BlockView(rt.nodes[i], rt.store.get(i), False) for i in sorted(rt.store.block_ids())]
    sig = signals(views, int(rt.model.config.vocab_size))
    out = []
    for leaf in (n for n in rt.nodes.values() if not n.children and n.parent is not None):
        for block_id, effect in leave_one_out(rt, leaf).items():
            out.append((sig[block_id], effect))
    return out


def write_calibration(samples, path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    weights, r2 = fit_weights([s for s, _ in samples], [e for _, e in samples])
    record = {
        "weights": weights.to_dict(),
        "signals": list(SIGNALS),
        "r2": r2,
        "n_samples": len(samples),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **meta,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record
