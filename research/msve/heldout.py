"""MSVE fits judged on trees they never saw: a split by tree, r² on both sides, every signal alone.

A calibration fitted and scored on the same samples says little (the one shipped before the run at size:
r² 0.17 in-sample on 319 samples of 12 trees; held out, below 0). Here each task's trees are split (a
seeded quarter held out, every sample of a tree on one side), the weights are fitted on the training trees
only, and r² is reported on the training samples and on the held-out ones, for all the signals together and
for each signal alone (its own fit: a bias and that one weight). A calibration fitted elsewhere (the
shipped one) can be judged beside them on the same held-out trees (``baseline``). Beside r², each fit's
Pearson correlation with the effect: MSVE ranks blocks through a sigmoid of the linear score, so a fit
whose scale is off (one fitted on other trees) can rank well with a poor r². The split, the fits and the
scores are JSON-friendly dicts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from arbor_runtime.policies.msve import SIGNALS

#: the share of each task's trees held out
HELD_OUT_SHARE = 0.25


def split_trees(samples: Sequence[dict[str, Any]], seed: int = 0, share: float = HELD_OUT_SHARE) -> set[tuple]:
    """The held-out (task, tree) keys: a seeded ``share`` of each task's trees, at least one of a task
    that has two or more (a task with one tree has nothing to hold out)."""
    held: set[tuple] = set()
    for task in sorted({s["task"] for s in samples}):
        trees = sorted({s["tree"] for s in samples if s["task"] == task})
        if len(trees) < 2:
            continue
        random.Random(f"{seed}:{task}").shuffle(trees)
        held |= {(task, t) for t in trees[: max(1, round(share * len(trees)))]}
    return held


def fit(features: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Least-squares coefficients (bias first) of ``y`` (N,) on ``features`` (N, k), float64, (k + 1,).

    A feature constant over the samples cannot be told from the bias (a task that sets no search value
    gives every block the same one): its weight is 0 and the others are fitted without it. The
    rank-revealing driver (``gelsd``) is named because CPU's default (``gelsy``) answers a design with
    such a column with coefficients of about 1e-17, every one of them."""
    varying = (features.amax(0) - features.amin(0)) > 0 if len(y) else torch.zeros(features.shape[1], dtype=bool)
    design = torch.cat([torch.ones(len(y), 1, dtype=torch.float64), features[:, varying]], dim=1)
    solution = torch.linalg.lstsq(design, y.unsqueeze(1), driver="gelsd").solution.squeeze(1)
    coef = torch.zeros(features.shape[1] + 1, dtype=torch.float64)
    coef[0] = solution[0]
    coef[1:][varying] = solution[1:]
    return coef


def r2(features: torch.Tensor, y: torch.Tensor, coef: torch.Tensor) -> float | None:
    """1 - SSE / SST of the fit ``coef`` on (features, y), against y's own mean; None for fewer than 2."""
    if len(y) < 2:
        return None
    pred = coef[0] + features @ coef[1:]
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / total if total > 0 else None


def correlation(features: torch.Tensor, y: torch.Tensor, coef: torch.Tensor) -> float | None:
    """Pearson correlation of the fit ``coef``'s predictions with ``y``; None when either is constant."""
    if len(y) < 2:
        return None
    pred = features @ coef[1:]
    pc, yc = pred - pred.mean(), y - y.mean()
    norm = float(pc.norm() * yc.norm())
    return float(pc @ yc) / norm if norm > 0 else None


def judged(features: torch.Tensor, y: torch.Tensor, coef: torch.Tensor, train: torch.Tensor, test: torch.Tensor):
    """r² and correlation of the fit ``coef`` on the ``train`` and ``test`` (boolean (N,)) samples."""
    held = bool(test.any())
    return {
        "train_r2": r2(features[train], y[train], coef),
        "held_out_r2": r2(features[test], y[test], coef) if held else None,
        "train_corr": correlation(features[train], y[train], coef),
        "held_out_corr": correlation(features[test], y[test], coef) if held else None,
    }


def report(
    samples: Sequence[dict[str, Any]], targets: Sequence[float], seed: int = 0, baseline: dict | None = None
) -> dict[str, Any]:
    """Per task (and ``all`` tasks together): trees and samples on each side, and for the fit of every
    signal and of each one alone (``search``, ...), its coefficients and train / held-out r² and
    correlation. Each task also judges ``joint``: the fit of every signal on all tasks' training trees
    (one set of weights for every task, as arbor loads it) on that task's samples.

    Args:
        samples: each with ``task``, ``tree`` and ``signals`` (in :data:`SIGNALS` order).
        targets: the fit target of each sample (:func:`research.msve.calibrate.effects`).
        baseline: weights fitted elsewhere (``bias`` and one per signal: a calibration file's
            ``weights``), judged as ``baseline`` on the same samples without refitting.
    """
    held = split_trees(samples, seed)
    x = torch.tensor([s["signals"] for s in samples], dtype=torch.float64)
    y = torch.tensor(list(targets), dtype=torch.float64)
    out: dict[str, Any] = {"seed": seed, "held_out_share": HELD_OUT_SHARE, "tasks": {}}
    every = torch.tensor([(s["task"], s["tree"]) not in held for s in samples])
    joint = fit(x[every], y[every]) if int(every.sum()) >= len(SIGNALS) + 2 else None
    for task in [*sorted({s["task"] for s in samples}), "all"]:
        mine = [task in ("all", s["task"]) for s in samples]
        test = torch.tensor([m and (s["task"], s["tree"]) in held for m, s in zip(mine, samples, strict=True)])
        train = torch.tensor(mine) & ~test
        trees = {(s["task"], s["tree"]) for m, s in zip(mine, samples, strict=True) if m}
        entry: dict[str, Any] = {
            "train_trees": len(trees - held), "held_out_trees": len(trees & held),
            "train_samples": int(train.sum()), "held_out_samples": int(test.sum()),
        }  # fmt: skip
        for name, cols in [("all", list(range(len(SIGNALS)))), *((s, [i]) for i, s in enumerate(SIGNALS))]:
            if int(train.sum()) < len(cols) + 2:
                continue
            coef = fit(x[train][:, cols], y[train])
            entry[name] = {
                "coef": {"bias": float(coef[0]), **{SIGNALS[c]: float(w) for c, w in zip(cols, coef[1:], strict=True)}},
                **judged(x[:, cols], y, coef, train, test),
            }
        if joint is not None and task != "all":
            entry["joint"] = {"coef": dict(zip(("bias", *SIGNALS), joint.tolist(), strict=True))}
            entry["joint"] |= judged(x, y, joint, train, test)
        if baseline is not None:
            coef = torch.tensor([baseline["bias"], *(baseline[s] for s in SIGNALS)], dtype=torch.float64)
            entry["baseline"] = {"coef": dict(baseline), **judged(x, y, coef, train, test)}
        out["tasks"][task] = entry
    return out
