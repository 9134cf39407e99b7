"""The results page's MSVE calibration section: every fit judged on held-out trees, from committed samples.

``docs/data/msve-calibration/results.json`` holds one row per task (and ``all``) and fit: every signal
together, each signal alone, and the calibration arbor shipped before (``baseline``: its weights judged
on the same trees without refitting); ``samples.jsonl`` holds every sample the fits were made from, so
the table can be recounted (:func:`rows` of :func:`research.msve.heldout.report` over them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arbor_runtime.policies.msve import SIGNALS
from benchmarks.results.data import columns_spec

SECTION = "msve-calibration"
TITLE = "MSVE calibration at size, judged on held-out trees (SmolLM2-135M, CPU)"
FITS = ("all", "joint", *SIGNALS, "baseline")
LABELS = {
    "all": "every signal", "joint": "every signal, one fit for both tasks", "baseline": "shipped before",
} | {s: f"{s} alone" for s in SIGNALS}  # fmt: skip
COLUMNS = columns_spec([
    ("task", "task", "text"), ("fit", "fit", "text"), ("train_trees", "train trees", "auto"),
    ("held_out_trees", "held-out trees", "auto"), ("train_samples", "train samples", "auto"),
    ("held_out_samples", "held-out samples", "auto"), ("train_r2", "train r²", "{:.3f}"),
    ("held_out_r2", "held-out r²", "{:.3f}"), ("held_out_corr", "held-out correlation", "{:.3f}"),
    *((k, f"w {k}", "{:.2f}") for k in ("bias", *SIGNALS)),
])  # fmt: skip


def rows(held_out: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows from a held-out report (:func:`research.msve.heldout.report`): a row per task
    and fit, the fit's coefficients in their own columns (absent where the fit has none)."""
    out = []
    for task, entry in held_out["tasks"].items():
        sizes = {k: entry[k] for k in ("train_trees", "held_out_trees", "train_samples", "held_out_samples")}
        for fit in (f for f in FITS if f in entry):
            scores = {k: entry[fit][k] for k in ("train_r2", "held_out_r2", "held_out_corr")}
            out.append({"task": task, "fit": LABELS[fit], **sizes, **scores, **entry[fit]["coef"]})
    return out


def tree_minutes(samples: list[dict[str, Any]]) -> float | None:
    """Minutes the trees took to record and measure (each tree's ``tree_seconds`` once), or None."""
    seconds = {(s["task"], s["tree"]): s.get("tree_seconds") for s in samples}
    return None if None in seconds.values() else round(sum(seconds.values()) / 60, 1)


def write(record: dict[str, Any], samples: list[dict[str, Any]], command: str, baseline: dict | None) -> Path:
    """docs/data/msve-calibration: results.json (the table, the settings, the weights written) and
    samples.jsonl (every sample)."""
    from benchmarks.results.data import DATA, write_section_data

    settings = {k: record[k] for k in ("n_samples", "n_outcome_samples", "model") if k in record}
    settings |= {k: record[k] for k in ("game24_rows", "gsm8k_train_rows", "n_generate", "breadth") if k in record}
    settings |= {"collect_minutes": tree_minutes(samples), "seed": record["held_out"]["seed"]}
    settings |= {"held_out_share": record["held_out"]["held_out_share"], "baseline": baseline}
    facts = {"weights": record["weights"], "in_sample_r2": record["r2"]}
    path = write_section_data(SECTION, rows(record["held_out"]), command, settings, title=TITLE, columns=COLUMNS,
                              facts=facts)  # fmt: skip
    (DATA / SECTION / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return path
