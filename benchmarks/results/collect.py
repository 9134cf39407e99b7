"""Sections' data from benchmarks that still write their own JSONL under bench/ (until each calls
:func:`~benchmarks.results.data.write_section_data` itself).

    python -m benchmarks.results.collect concurrency bench/concurrency \
        --command "python scripts/bench_concurrency.py ..."

A collector globs the benchmark's files (JSONL: a row per line; JSON: the list under ``rows_at``, or
the whole file as one row), renames its keys to the committed section's column keys (so the
section's template keeps working; ``a.b`` is key ``b`` inside ``a``), and writes
docs/data/<section>/results.json with this run's commit, date and machine. Booleans become yes / no,
as the tables show them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .data import DATA, load_section, write_section_data

FOLDER = "<folder>"  # the row's value is the name of the folder its file is in (one search per folder)


@dataclass(frozen=True, slots=True)
class Collector:
    """``pattern`` under the benchmark's output folder; ``keys``: section column key -> benchmark key."""

    pattern: str
    keys: dict[str, str]
    scale: dict[str, float] | None = None  # section key -> factor (a share in [0, 1] shown as a percentage)
    #: a .json file's key whose list holds the rows (None: the file is one row; "": the file is the list)
    rows_at: str | None = None
    #: the main table's (key, header, fmt), when they are not the committed file's (a section whose
    #: table gains columns); None keeps the committed columns
    columns: list[tuple[str, str, str]] | None = None
    #: one benchmark record -> the records the keys read (a record per row); None: the record itself
    expand: Callable[[dict], list[dict]] | None = None
    #: columns this benchmark does not remeasure (a "before" measured at an older commit), kept from the
    #: committed row with the same values in ``match``; the page names them as kept
    kept_columns: tuple[str, ...] = ()
    match: tuple[str, ...] = ()


def replay_records(record: dict) -> list[dict]:
    """A replay.jsonl row named by its trace as the section names it ("game24-900")."""
    return [record | {"trace": f"{record.get('task')}-{record.get('problem')}"}]


def speed_records(record: dict) -> list[dict]:
    """bench_speed.py's summary of one trace -> a row per method (runtime, naive, prefix_cache): median
    seconds, prefill tokens, forward calls, the runtime's ratio to the method (time, prefill tokens),
    and the runtime's overhead outside model forwards (its own row, as a percentage)."""
    out = []
    for method, m in record["methods"].items():
        ratio = record["ratios"].get(f"runtime/{method}", {})
        overhead = record["runtime_overhead"]["fraction"] if method == "runtime" else None
        out.append({
            "trace": f"{record.get('task')} #{record.get('problem')}", "method": method,
            "median_s": m["median_seconds"], "prefill_tokens": m["prefill_tokens"],
            "forward_calls": m["forward_calls"], "time_ratio": ratio.get("seconds"),
            "prefill_ratio": ratio.get("prefill_tokens"),
            "overhead_pct": None if overhead is None else 100.0 * overhead,
        })  # fmt: skip
    return out


COLLECTORS = {
    "concurrency": Collector(
        "*/concurrency.jsonl",
        {
            "search": FOLDER, "policy": "policy", "concurrency": "concurrency", "problems": "problems",
            "seconds": "seconds", "problems_hour": "problems_per_hour", "peak_kv_mb": "peak_device_mb",
            "decode_tokens": "decode_tokens", "oom": "oom", "same_results_as_1": "same_results_as_concurrency_1",
            "prefill_saved": "prefix_prefill_saved_tokens", "turn_wait_s": "turn_wait_seconds",
            "solved": "solved", "resident_saved": "prefix_resident_saved_tokens", "rehydrations": "rehydrations",
            "preemptions": "preemptions", "peak_sum": "peak_device_tokens_sum",
        },
        columns=[
            ("search", "search", "text"), ("policy", "policy", "text"), ("concurrency", "concurrency", "auto"),
            ("problems", "problems", "auto"), ("solved", "solved", "auto"), ("seconds", "seconds", "auto"),
            ("problems_hour", "problems/hour", "auto"), ("peak_kv_mb", "peak KV MB", "auto"),
            ("prefill_saved", "prefill tokens saved", "auto"), ("resident_saved", "resident tokens saved", "auto"),
            ("turn_wait_s", "turn waits s", "auto"), ("rehydrations", "rehydrations", "auto"),
            ("preemptions", "preemptions", "auto"), ("oom", "OOM", "auto"),
            ("same_results_as_1", "same results as 1", "text"),
        ],
    ),
    "sparse": Collector(
        "sparse.jsonl",
        {
            "model": "model", "context": "context", "method": "method", "decode_tok_s": "decode_tok_s",
            "x_dense": "speedup", "attn_ms_step": "attn_ms_step", "attn_x_dense": "attn_speedup",
            "index_ms": "index_ms_step", "sparse_attn_ms": "sparse_attn_ms_step", "build_s": "build_s",
            "read": "read_fraction", "index_pct_kv": "index_pct", "top_1_gsm8k": "top1_gsm8k", "kl_gsm8k": "kl_gsm8k",
            "top_1_math": "top1_math500", "kl_math": "kl_math500",
        },
        scale={"read": 100.0},
    ),
    "wide": Collector(  # bench_memory.py's JSON list (the runtime now); the "before" columns are kept
        "after.json",
        {
            "policy": "policy", "rows": "rows", "peak_alloc_tree_kv_after": "peak_over_tree_kv",
            "peak_alloc_mb_after": "peak_alloc_mb", "decode_tok_s_after": "decode_tokens_per_s",
        },
        rows_at="",
        kept_columns=("peak_alloc_tree_kv_before", "peak_alloc_mb_before", "decode_tok_s_before"),
        match=("policy", "rows"),
    ),
    "linear": Collector(  # bench_linear.py's comparison table; its other tables are kept (carried)
        "linear.json",
        {
            "policy": "policy", "kvpress_press": "press", "kept": "kept_share", "kl": "kl", "press_kl": "press_kl",
            "token_kl": "token_kl", "xpress": "ratio_vs_press", "xtoken": "ratio_vs_token", "top_1": "top1",
            "press_top_1": "press_top1", "token_top_1": "token_top1",
        },
        scale={"kept": 100.0},
        rows_at="comparison",
    ),
    "kvp": Collector(  # kvp_train.py's reports (one per loss); the benchmark and replay tables are kept (carried)
        "train*.json",
        {
            "loss": "settings.loss", "train_s": "seconds", "train_seqs": "sequences.train",
            "held_out_seqs": "sequences.held_out", "kvp_head": "final.kvp/head_auc",
            "oracle_head": "final.oracle/head_auc", "knorm_head": "final.knorm/head_auc",
            "streaming_head": "final.streaming/head_auc", "recency_head": "final.recency/head_auc",
            "kvp_token": "final.kvp/token_auc", "oracle_token": "final.oracle/token_auc",
        },
    ),
    "budgets": Collector(
        "*/budgets.jsonl",
        {
            "search": FOLDER, "problem": "problem", "policy": "policy", "budget_tok": "budget",
            "x_full_peak": "fraction", "floor": "floor_fraction", "oom": "oom", "same_tree_as_full": "same_tree",
            "max_d_logprob": "max_logprob_gap", "time_full": "time_vs_full", "preemptions": "preemptions",
            "rehydrations": "rehydrations", "peak_kv_mb": "peak_device_mb", "peak_host_mb": "peak_host_mb",
        },
    ),
    "controllers": Collector(  # scripts/bench_controllers.sh: one arbor-solve run dir per task and controller
        "*/results.jsonl",
        {
            "task_controller": FOLDER, "problem": "index", "policy": "policy", "verifier": "verifier",
            "solved": "solved", "steps": "steps", "nodes_created": "nodes_created",
            "branch_switches": "branch_switch_events", "peak_kv_tok": "peak_device_tokens", "seconds": "seconds",
        },
        columns=[
            ("task_controller", "task-controller", "text"), ("problem", "problem", "text"),
            ("policy", "policy", "text"), ("verifier", "verifier", "text"), ("solved", "solved", "text"),
            ("steps", "search steps", "auto"), ("nodes_created", "nodes created", "auto"),
            ("branch_switches", "branch switches", "auto"), ("peak_kv_tok", "peak KV tok", "auto"),
            ("seconds", "seconds", "{:.1f}"),
        ],
    ),
    "replay": Collector(  # scripts/replay_trace.py's replay.jsonl over the traces of record_trace.py
        "replay.jsonl",
        {
            "trace": "trace", "policy": "policy", "budget_x_full_peak": "budget_fraction",
            "budget_tok": "budget_tokens", "top_1_agree": "top1_agreement", "mean_kl": "mean_kl",
            "mean_dll": "mean_dll", "peak_kv_tok": "peak_device_tokens", "peak_host_b": "peak_host_bytes",
            "rehydr": "rehydrations", "oom": "oom", "s": "seconds",
        },
        expand=replay_records,
    ),
    "speed": Collector(  # scripts/bench_speed.py's JSON (one summary per trace)
        "speed.json",
        {
            "trace": "trace", "method": "method", "median_s": "median_s", "prefill_tokens": "prefill_tokens",
            "forward_calls": "forward_calls", "runtime_method_time": "time_ratio",
            "runtime_method_prefill_tokens": "prefill_ratio", "runtime_overhead": "overhead_pct",
        },
        rows_at="",
        expand=speed_records,
    ),
}  # fmt: skip


def _cell(value):
    return ("yes" if value else "no") if isinstance(value, bool) else value


def _records(path: Path, rows_at: str | None) -> list[dict]:
    """The benchmark's records in one file: a JSONL line each, or a JSON file's list (or the file itself)."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    doc = json.loads(path.read_text())
    if rows_at == "":  # the file is a list of records
        return doc
    return doc[rows_at] if rows_at else [doc]


def _get(raw: dict, key: str):
    """``raw[key]``, where ``a.b`` is ``raw[a][b]``; None when any part is missing."""
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def rows(name: str, root: Path) -> list[dict]:
    """The benchmark's rows under ``root`` with the section's column keys (missing keys are None)."""
    spec = COLLECTORS[name]
    out = []
    for path in sorted(root.glob(spec.pattern)):
        records = _records(path, spec.rows_at)
        for raw in records if spec.expand is None else [r for rec in records for r in spec.expand(rec)]:
            row = {k: path.parent.name if b == FOLDER else _cell(_get(raw, b)) for k, b in spec.keys.items()}
            for key, factor in (spec.scale or {}).items():
                row[key] = None if row[key] is None else row[key] * factor
            out.append(row)
    return out


def write(name: str, root: Path, command: str, settings: dict | None = None, data_root: Path | None = None) -> Path:
    """Write docs/data/<name>/results.json from the benchmark's outputs under ``root``."""
    found = rows(name, root)
    if not found:
        raise SystemExit(f"collect: error: no {COLLECTORS[name].pattern} under {root}")
    committed = load_section(name, DATA)  # its columns and title are what the template expects
    spec = COLLECTORS[name]
    if spec.kept_columns:
        found = keep_columns(found, committed["tables"]["main"]["rows"], spec.kept_columns, spec.match)
    kept = carried(committed, settings or {}, spec.kept_columns)
    return write_section_data(
        name,
        found,
        command,
        committed.get("settings", {}) | (settings or {}),
        title=committed["title"],
        columns=_columns(COLLECTORS[name], committed, found),
        **kept,
        root=data_root,
    )


def _columns(spec: Collector, committed: dict, found: list[dict]) -> list[dict]:
    """The collector's own columns (numeric where every value is a number), else the committed ones."""
    if spec.columns is None:
        return committed["tables"]["main"]["columns"]
    out = []
    for key, header, fmt in spec.columns:
        numeric = fmt != "text" and all(isinstance(r.get(key), (int, float)) for r in found if r.get(key) is not None)
        out.append({"key": key, "header": header, "fmt": fmt, "numeric": numeric})
    return out


def keep_columns(
    found: list[dict], committed: list[dict], columns: tuple[str, ...], match: tuple[str, ...]
) -> list[dict]:
    """``found`` with ``columns`` taken from the committed row whose ``match`` values are the same (None
    where no committed row matches)."""
    by_key = {tuple(r.get(k) for k in match): r for r in committed}
    out = []
    for row in found:
        old = by_key.get(tuple(row.get(k) for k in match), {})
        out.append(row | {c: old.get(c) for c in columns})
    return out


def kept_from(committed: dict) -> dict:
    """When what a rerun keeps was measured: the committed data's own date and commit, or, when it kept
    parts of an earlier measurement already, that one's (a section rerun twice names the first)."""
    before = committed.get("carried") or {}
    when = before.get("commit") or committed.get("commit") or committed.get("committed_in") or "?"
    return {"measured": before.get("measured") or committed.get("measured"), "commit": when[:12]}


def carried(committed: dict, settings: dict, columns: tuple[str, ...] = ()) -> dict:
    """What a rerun of the main table does not remeasure (other tables, ``columns`` of the main one,
    figures the prose quotes, settings the caller did not give), kept from the committed data with where
    it came from (:func:`kept_from`), so the section's template still renders and its provenance line says
    which parts are older."""
    tables = {k: v for k, v in committed["tables"].items() if k != "main"}
    old_settings = sorted(set(committed.get("settings", {})) - set(settings))
    if not tables and not committed.get("facts") and not old_settings and not columns:
        return {}
    origin = kept_from(committed)
    origin |= {"tables": sorted(tables), "facts": sorted(committed.get("facts", {})), "settings": old_settings}
    if columns:
        origin["columns"] = list(columns)
    return {"tables": tables, "facts": committed.get("facts", {}), "carried": origin}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=sorted(COLLECTORS))
    ap.add_argument("outputs", type=Path, help="the benchmark's --out folder (one subfolder per search)")
    ap.add_argument("--command", required=True, help="the command that produced the outputs (recorded)")
    ap.add_argument("--data-root", type=Path, default=None, help="docs/data by default")
    args = ap.parse_args(argv)
    print(f"wrote {write(args.section, args.outputs, args.command, data_root=args.data_root)}")


if __name__ == "__main__":
    main()
