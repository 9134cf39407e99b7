"""MSVE calibration runs: record full-retention BFS trees, measure leave-one-out effects, fit.

Two effects per masked block: the drop in log-likelihood of the recorded continuation, and (for a
few thoughts per tree) the drop in the verifier's score when the thought is regenerated greedily
without the block. Both are z-scored and added to form the fit target.

Game of 24 puzzles outside the evaluation slice (rows before 900) and GSM8K *train* questions.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from arbor_cli.build import Setup
from arbor_runtime import Runtime
from arbor_runtime.policies import ArborPolicy
from arbor_runtime.policies.base import BlockView
from arbor_runtime.policies.msve import SIGNALS, signals
from arbor_runtime.tasks.base import Task
from arbor_runtime.verifiers.base import Verifier
from research.msve.calibration import fit_weights, leave_one_out, regenerate
from research.msve.heldout import report


@dataclass(slots=True)
class RecordingArbor(ArborPolicy):
    """Arbor that records attention statistics on every forward. Arbor itself records them only
    within one operation of its floor (``Capabilities.stats_on_pressure``): a calibration tree, grown
    without a budget, would leave every block's attention at zero and the attention signal nothing to
    fit (every sample's attention density 0, its weight 0)."""

    CAPABILITIES = replace(ArborPolicy.CAPABILITIES, stats_on_pressure=False)


def collect(setup: Setup, progress: Progress | None = None, outcome_pairs: int = 8) -> list[dict[str, Any]]:
    """Samples from the configured search (BFS that keeps its pruned branches, in the calibration
    script) over the problems of ``setup`` (see :func:`tree_samples`)."""
    samples, task, verifier = [], setup.task, setup.verifier
    bar = progress.add_task(f"calibrate {task.name}", total=len(setup.problems)) if progress else None
    for problem in setup.problems:
        started = time.perf_counter()
        rt = setup.runtime(problem, policy=RecordingArbor())  # no budget: evicts nothing
        setup.controller(rt).solve(problem)
        tree = tree_samples(rt) + outcome_samples(rt, task, verifier, problem, outcome_pairs)
        seconds = round(time.perf_counter() - started, 2)
        # the held-out split is by tree
        samples += [{"task": task.name, "tree": problem.index} | s | {"tree_seconds": seconds} for s in tree]
        if progress:
            progress.advance(bar)
    return samples


def tree_samples(rt: Runtime) -> list[dict[str, Any]]:
    """For every leaf, the leave-one-out LL effect of each inner block, with that block's signals."""
    sig = _signals(rt)
    out = []
    for leaf in (n for n in rt.nodes.values() if not n.children and n.parent is not None):
        for block_id, effect in leave_one_out(rt, leaf).items():
            out.append({"signals": sig[block_id], "ll": effect, "outcome": None})
    return out


def outcome_samples(rt: Runtime, task: Task, verifier: Verifier, problem, limit: int) -> list[dict[str, Any]]:
    """Verifier-outcome effects: regenerate a thought greedily with one ancestor block masked and
    compare the verifier's score of the new thought with the recorded one (up to ``limit`` pairs)."""
    sig, out = _signals(rt), []
    thoughts = [n for n in rt.nodes.values() if n.kind == "generated" and "state" in n.parent.meta and n.depth >= 2]
    pairs = [(t, b) for t in thoughts for b in t.path()[1:-1]][:limit]
    for thought, masked in pairs:
        recorded = _score(task, verifier, problem, thought.parent.meta["state"], thought.text)
        context = [n for n in thought.path()[:-1] if n is not masked]
        text = regenerate(rt, context, task.max_thought_tokens, list(task.stop))
        changed = recorded - _score(task, verifier, problem, thought.parent.meta["state"], text)
        ll = leave_one_out(rt, thought).get(masked.id, 0.0) if thought.length > 1 else 0.0
        out.append({"signals": sig[masked.id], "ll": ll, "outcome": changed})
    return out


def _score(task: Task, verifier: Verifier, problem, state, text: str) -> float:
    result = task.step(problem, state, text)
    return verifier.score(problem, result) if result.valid else 0.0


def _signals(rt: Runtime):
    views = [BlockView(rt.nodes[i], rt.store.get(i), False) for i in sorted(rt.store.block_ids())]
    return signals(views, int(rt.model.config.vocab_size))


def effects(samples: list[dict[str, Any]]) -> list[float]:
    """Fit target per sample: z-scored LL drop, plus z-scored verifier-outcome drop where measured."""
    ll = _zscores([s["ll"] for s in samples])
    measured = [s["outcome"] for s in samples if s["outcome"] is not None]
    oz = iter(_zscores(measured)) if len(measured) > 1 else iter([0.0] * len(measured))
    return [z + (next(oz) if s["outcome"] is not None else 0.0) for z, s in zip(ll, samples, strict=True)]


def _zscores(xs: list[float]) -> list[float]:
    mean = sum(xs) / len(xs)
    std = (sum((x - mean) ** 2 for x in xs) / max(len(xs) - 1, 1)) ** 0.5 or 1.0
    return [(x - mean) / std for x in xs]


def save(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write a calibration record (the JSON arbor loads) to ``path``; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def calibration_record(samples, meta: dict[str, Any], baseline: dict | None = None) -> dict[str, Any]:
    """Fit every signal on every sample (the weights arbor loads) and each signal alone (``single``: what
    ``policy.msve=<signal>`` loads), and judge the fits on held-out trees when the samples name their
    trees (:mod:`research.msve.heldout`; ``baseline``: another calibration's weights judged beside them)."""
    targets = effects(samples)
    features = [s["signals"] for s in samples]
    weights, r2 = fit_weights(features, targets)
    single = {name: fit_weights(features, targets, only=name)[0].to_dict() for name in SIGNALS}
    record = {
        "weights": weights.to_dict(),
        "single": {name: {k: v for k, v in w.items() if k in ("bias", name)} for name, w in single.items()},
        "signals": list(SIGNALS),
        "r2": r2,
        "n_samples": len(samples),
        "n_outcome_samples": sum(s["outcome"] is not None for s in samples),
        "held_out": report(samples, targets, baseline=baseline) if all("tree" in s for s in samples) else None,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **meta,
    }
    return record
