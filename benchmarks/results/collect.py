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
from typing import Any

from .data import DATA, columns_for, load_section, write_section_data

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
    #: a file's records -> the records the keys read, when a row joins several records (a pivot)
    join: Callable[[list[dict]], list[dict]] | None = None
    #: columns this benchmark does not remeasure (a "before" measured at an older commit), kept from the
    #: committed row with the same values in ``match``; the page names them as kept
    kept_columns: tuple[str, ...] = ()
    match: tuple[str, ...] = ()
    #: where this run measured those columns itself (the older checkout run beside it, in the same
    #: folder): its rows fill ``kept_columns`` by ``match`` and nothing is kept; absent, they are kept
    remeasured: Collector | None = None
    #: the section's other tables, each read like the main one from its own files under the same folder
    #: (the spec's ``columns`` None keeps the committed table's); a table whose files are absent is kept
    tables: tuple[tuple[str, Collector], ...] = ()
    #: the figures the prose quotes, computed from the outputs folder (those it returns; the rest are kept)
    facts: Callable[[Path], dict[str, Any]] | None = None
    #: the section's settings read from the outputs (over the committed ones; the caller's win)
    settings: Callable[[Path], dict[str, Any]] | None = None


DTYPES = ("fp16", "int8")
#: the float16-vs-int8 index table: section key -> bench_sparse.py key, and its header and format
INDEX_KEYS = {
    "index_pct_kv": "index_pct", "index_mb": "index_mb", "top_1_gsm8k": "top1_gsm8k", "kl_gsm8k": "kl_gsm8k",
    "top_1_math": "top1_math500", "kl_math": "kl_math500",
}  # fmt: skip
INDEX_HEADERS = {
    "index_pct_kv": ("index % KV", "{:,.2f}%"), "index_mb": ("index MB", "{:,.2f}"),
    "top_1_gsm8k": ("top-1 GSM8K", "{:,.3f}"), "kl_gsm8k": ("KL GSM8K", "{:.4g}"),
    "top_1_math": ("top-1 MATH", "{:,.3f}"), "kl_math": ("KL MATH", "{:.4g}"),
}  # fmt: skip


def float16_vs_int8(records: list[dict]) -> list[dict]:
    """bench_sparse.py's lychee and lychee-fp16 rows -> one record per context: each measure of the
    float16 index (``KEY_fp16``) beside the int8 one (``KEY_int8``); contexts missing either are left out."""
    by_context: dict[int, dict[str, dict]] = {}
    for r in records:
        by_context.setdefault(r["context"], {})[r["method"]] = r
    out = []
    for context, methods in sorted(by_context.items()):
        if {"lychee", "lychee-fp16"} <= set(methods):
            row = {"context": context}
            for key in INDEX_KEYS.values():
                row |= {f"{key}_fp16": methods["lychee-fp16"].get(key), f"{key}_int8": methods["lychee"].get(key)}
            out.append(row)
    return out


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


def linear_method_records(record: dict) -> list[dict]:
    """A bench_linear.py row as the section names it: side ``kvpress/token`` -> side ``kvpress``,
    method ``knorm (token)``."""
    side, _, variant = record["side"].partition("/")
    return [record | {"side": side, "method": f"{record['method']} ({variant})" if variant else record["method"]}]


def stats_cost_records(record: dict) -> list[dict]:
    """bench_stats_cost.py's JSON -> a row per policy."""
    return [{"policy": policy} | m for policy, m in record["policies"].items()]


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


#: the context the linear section's prose singles out (where per-head choice matters most)
MATH_CTX = "math500:5:200"


def _context_kl(doc: dict, side: str, method: str, kept: float, context: str) -> float | None:
    """A bench_linear.py row's mean KL on one context (None when the run has no such row or context)."""
    names = [c["name"] for c in doc["contexts"]]
    for r in doc["rows"]:
        if (r["side"], r["method"], r["kept_share"]) == (side, method, kept) and context in names:
            return r["context_mean_kl"][names.index(context)]
    return None


def linear_settings(root: Path) -> dict[str, Any]:
    """bench_linear.py's settings the section's prose names (threads, continuation, contexts, kvpress side)."""
    doc = _json(root / "linear.json")
    if doc is None:
        return {}
    versions = doc["kvpress_versions"]
    fanout = [c["fan_out_check"] for c in doc["checks"] if "fan_out_check" in c]
    press = {}
    if fanout:
        press["fanout_check_press"] = f"{fanout[0]['press']} at ratio {fanout[0]['compression_ratio']:g}"
    return press | {
        "torch_threads": doc["threads"], "continuation_tokens": doc["steps"],
        "contexts": {c["name"]: c["context_tokens"] for c in doc["contexts"]},
        "kvpress_side": f"kvpress {versions['kvpress']}, transformers {versions['transformers']}, "
                        f"torch {versions['torch']}, eager attention",
    }  # fmt: skip


def linear_facts(root: Path) -> dict[str, Any]:
    """The figures the linear section's prose quotes, from bench_linear.py's and bench_stats_cost.py's JSON."""
    facts: dict[str, Any] = {}
    doc = _json(root / "linear.json")
    if doc is not None:
        fanout = [c["fan_out_check"]["max_abs_logp_diff"] for c in doc["checks"] if "fan_out_check" in c]
        facts |= {
            "project_minutes": doc["seconds"]["project"] / 60, "kvpress_minutes": doc["seconds"]["kvpress"] / 60,
            "max_logp_diff_uncompressed": max(c["max_abs_token_logp_diff"] for c in doc["checks"]),
            "max_logp_diff_fanout": max(fanout) if fanout else None,
            "streaming_prefill_x_full_in_bench_linear": doc["prefill_cost"]["streaming"]["vs_full"],
            "h2o_math500_per_head_kl_50": _context_kl(doc, "kvpress/per_head", "observed_attention", 0.5, MATH_CTX),
            "h2o_math500_token_kl_50": _context_kl(doc, "kvpress/token", "observed_attention", 0.5, MATH_CTX),
            "h2o_math500_kl_50": _context_kl(doc, "project", "h2o", 0.5, MATH_CTX),
        }  # fmt: skip
    cost = _json(root / "stats_cost.json")
    if cost is not None:
        keys = ("context", "context_tokens", "rows", "new_tokens", "repeats", "threads")
        facts |= {"stats_cost_" + k: cost[k] for k in keys}
    return facts


def _context_kls(bench: dict) -> dict[tuple[str, float], dict[int, float]]:
    """bench_kvp.py's per-context runs -> (policy, kept share) -> context index -> that run's mean KL."""
    out: dict[tuple[str, float], dict[int, float]] = {}
    for i, context in enumerate(bench.get("per_context", [])):
        for run in context["runs"]:
            if run.get("kl"):
                key = (run["policy"], round(1 - run["compression_ratio"], 6))
                out.setdefault(key, {})[i] = sum(run["kl"]) / len(run["kl"])
    return out


#: training-loss points kept per loss for the section's curve (the report holds one per step)
CURVE_POINTS = 120


def kvp_curve_records(report: dict) -> list[dict]:
    """kvp_train.py's report -> its training curve: the loss at about :data:`CURVE_POINTS` evenly spaced
    steps (each the mean of the steps since the previous point) and the held-out AUCs at every eval."""
    loss, losses = report["settings"]["loss"], report["losses"]
    every = max(1, -(-len(losses) // CURVE_POINTS))
    out = [
        {"loss": loss, "step": i + len(chunk), "train_loss": sum(chunk) / len(chunk)}
        for i in range(0, len(losses), every)
        if (chunk := losses[i : i + every])
    ]
    for step, aucs in report.get("evals", []):
        out.append({"loss": loss, "step": step, "kvp_head_auc": aucs.get("kvp/head_auc"),
                    "kvp_token_auc": aucs.get("kvp/token_auc")})  # fmt: skip
    return out


def kvp_bench_records(record: dict) -> list[dict]:
    """bench_kvp.py's JSON -> its summary rows, each with its mean KL on every context (bench order)."""
    per = _context_kls(record)
    out = []
    for r in record["rows"]:
        by_context = per.get((r["policy"], r["kept_share"]))
        out.append(r | {"context_mean_kl": list(by_context.values()) if by_context else None})
    return out


#: the KVP weights the runtime ships (policy=kvp's default)
SHIPPED_KVP = Path(__file__).resolve().parents[2] / "arbor_runtime" / "policies" / "weights" / "kvp-smollm2.safetensors"


def _weights_info(path: Path) -> dict[str, Any]:
    """A KVP weights file's training record (kvp_train.py's report), {} when the file is absent."""
    if not path.is_file():
        return {}
    from arbor_runtime.policies.kvp_weights import read_metadata

    return json.loads(read_metadata(path).get("info", "{}"))


def budgets_losses(bench: dict, shares: tuple[float, ...] = (0.1, 0.2)) -> dict[str, int]:
    """Context/share cells at the small ``shares`` where the ``kvp-budgets`` variant's mean KL is above the
    shipped ``kvp``'s: how many, of how many cells both ran ({} when the bench has no such variant)."""
    kls = _context_kls(bench)
    pairs = [
        (kls[("kvp", s)], kls[("kvp-budgets", s)]) for s in shares if ("kvp", s) in kls and ("kvp-budgets", s) in kls
    ]
    cells = [(shipped[i], budgets[i]) for shipped, budgets in pairs for i in shipped if i in budgets]
    if not cells:
        return {}
    losses = sum(budgets > shipped for shipped, budgets in cells)
    return {"kvp_budgets_losses_10_20": losses, "kvp_budgets_cells_10_20": len(cells)}


def kvp_facts(root: Path) -> dict[str, Any]:
    """The figures the KVP section's prose quotes: training tokens (kvp_train.py's report), the
    benchmark's minutes and kvp's scoring cost per decode step (bench_kvp.py's JSON)."""
    facts: dict[str, Any] = {}
    report = _json(root / "train-listnet.json")
    if report is not None:
        facts["train_context_tokens"] = report["sequences"]["train_tokens"]
    shipped = _weights_info(SHIPPED_KVP)
    if shipped:
        facts["shipped_loss"] = shipped.get("loss", "listnet")
        facts["shipped_train_tokens"] = shipped["sequences"]["train_tokens"]
    bench = _json(root / "bench.json")
    if bench is not None:
        cost = bench.get("cost") or {}
        facts["bench_minutes"] = bench["seconds"] / 60
        facts["bench_threads"], facts["bench_steps"] = bench["threads"], bench["steps"]
        facts["bench_contexts"] = ", ".join(f"`{c['name']}` ({c['context_tokens']} tokens)" for c in bench["contexts"])
        facts |= budgets_losses(bench)
        if cost:
            facts |= {
                "cost_context": cost["context"], "cost_budget_tokens": cost["budget_tokens"],
                "scoring_ms": cost["kvp_scoring_ms_per_step"], "step_ms": cost["kvp_ms_per_step"],
                "tokens_scored_per_step": cost["kvp_tokens_scored_per_step"],
                "streaming_step_ms": cost["streaming_ms_per_step"], "h2o_step_ms": cost["h2o_ms_per_step"],
            }  # fmt: skip
    return facts


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
        tables=(
            ("table2", Collector(  # bench_sparse.py --methods lychee,lychee-fp16 into int8/: one row per context
                "int8/sparse.jsonl",
                {"context": "context"} | {f"{k}_{d}": f"{b}_{d}" for k, b in INDEX_KEYS.items() for d in DTYPES},
                join=float16_vs_int8,
                columns=[("context", "context", "{:,}")] + [
                    (f"{k}_{d}", f"{h} {d}" if d == "fp16" else "int8", fmt)
                    for k, (h, fmt) in INDEX_HEADERS.items() for d in DTYPES
                ],
            )),
        ),
    ),
    "wide": Collector(  # bench_memory.py's JSON list (the runtime now, after.json; the checkout before
        # issue 8, before.json, when the run measured it too: else the "before" columns are kept)
        "after.json",
        {
            "policy": "policy", "rows": "rows", "peak_alloc_tree_kv_after": "peak_over_tree_kv",
            "peak_alloc_mb_after": "peak_alloc_mb", "decode_tok_s_after": "decode_tokens_per_s",
        },
        rows_at="",
        kept_columns=("peak_alloc_tree_kv_before", "peak_alloc_mb_before", "decode_tok_s_before"),
        match=("policy", "rows"),
        remeasured=Collector(
            "before.json",
            {
                "policy": "policy", "rows": "rows", "peak_alloc_tree_kv_before": "peak_over_tree_kv",
                "peak_alloc_mb_before": "peak_alloc_mb", "decode_tok_s_before": "decode_tokens_per_s",
            },
            rows_at="",
        ),
        settings=lambda root: _first_line(root / "before-commit.txt", "before_commit"),
    ),
    "linear": Collector(  # bench_linear.py's comparison table and every share; bench_stats_cost.py's table
        "linear.json",
        {
            "policy": "policy", "kvpress_press": "press", "kept": "kept_share", "kl": "kl", "press_kl": "press_kl",
            "token_kl": "token_kl", "xpress": "ratio_vs_press", "xtoken": "ratio_vs_token", "top_1": "top1",
            "press_top_1": "press_top1", "token_top_1": "token_top1",
        },
        scale={"kept": 100.0},
        rows_at="comparison",
        tables=(
            ("table2", Collector(  # every method at every share, both sides
                "linear.json",
                {"side": "side", "method": "method", "kept": "kept_share", "mean_kl": "mean_kl", "top_1": "top1",
                 "mean_kl_per_context": "context_mean_kl"},
                scale={"kept": 100.0}, rows_at="rows", expand=linear_method_records,
            )),
            ("table3", Collector(  # bench_stats_cost.py: what the attention statistics cost
                "stats_cost.json",
                {"policy": "policy", "prefill_ms_token": "prefill_ms_per_token", "x_full": "prefill_vs_full",
                 "x_full_wall": "prefill_wall_vs_full", "decode_ms_token": "expand_ms_per_token",
                 "x_full_2": "expand_vs_full", "x_full_wall_2": "expand_wall_vs_full"},
                expand=stats_cost_records,
            )),
        ),
        facts=linear_facts,
        settings=linear_settings,
    ),
    "kvp": Collector(  # kvp_train.py's reports (one per loss), bench_kvp.py's and bench_kvp_replay.py's tables
        "train*.json",
        {
            "loss": "settings.loss", "train_s": "seconds", "train_seqs": "sequences.train",
            "held_out_seqs": "sequences.held_out", "kvp_head": "final.kvp/head_auc",
            "oracle_head": "final.oracle/head_auc", "knorm_head": "final.knorm/head_auc",
            "streaming_head": "final.streaming/head_auc", "recency_head": "final.recency/head_auc",
            "kvp_token": "final.kvp/token_auc", "oracle_token": "final.oracle/token_auc",
        },
        tables=(
            ("table2", Collector(  # bench_kvp.py: the shipped weights (and the variants) on held-out contexts
                "bench.json",
                {"kept": "kept_share", "policy": "policy", "retained_future_attention": "retained",
                 "mean_kl": "mean_kl", "top_1": "top1", "mean_kl_per_context": "context_mean_kl"},
                scale={"kept": 100.0}, expand=kvp_bench_records,
            )),
            ("curve", Collector(  # kvp_train.py's reports: the training curves (drawn as kvp-train.png)
                "train*.json",
                {"loss": "loss", "step": "step", "train_loss": "train_loss", "kvp_head_auc": "kvp_head_auc",
                 "kvp_token_auc": "kvp_token_auc"},
                expand=kvp_curve_records,
            )),
            ("table3", Collector(  # bench_kvp_replay.py: arbor's in-block selector, a recorded search replayed
                "replay.jsonl",
                {"trace": "trace", "budget": "budget_fraction", "policy": "policy", "top_1": "top1_agreement",
                 "mean_kl": "mean_kl", "peak_kv_tok": "peak_device_tokens", "rehydrated_tok": "rehydrated_tokens",
                 "oom": "oom"},
                scale={"budget": 100.0}, expand=replay_records,
            )),
        ),
        facts=kvp_facts,
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


def _first_line(path: Path, key: str) -> dict[str, str]:
    """``{key: the file's first line}``, or nothing when the file is absent."""
    return {key: path.read_text().splitlines()[0].strip()} if path.is_file() else {}


def _get(raw: dict, key: str):
    """``raw[key]``, where ``a.b`` is ``raw[a][b]``; None when any part is missing."""
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def table_rows(spec: Collector, root: Path) -> list[dict]:
    """One table's rows: ``spec.pattern``'s files under ``root``, renamed and scaled by ``spec``."""
    out = []
    for path in sorted(root.glob(spec.pattern)):
        records = _records(path, spec.rows_at)
        records = spec.join(records) if spec.join else records
        for raw in records if spec.expand is None else [r for rec in records for r in spec.expand(rec)]:
            row = {k: path.parent.name if b == FOLDER else _cell(_get(raw, b)) for k, b in spec.keys.items()}
            for key, factor in (spec.scale or {}).items():
                row[key] = None if row[key] is None else row[key] * factor
            out.append(row)
    return out


def write(name: str, root: Path, command: str, settings: dict | None = None, data_root: Path | None = None) -> Path:
    """Write docs/data/<name>/results.json from the benchmark's outputs under ``root``: the main table,
    the other tables and figures whose outputs are there, and the rest kept from the committed data."""
    spec = COLLECTORS[name]
    found = table_rows(spec, root)
    if not found:
        raise SystemExit(f"collect: error: no {spec.pattern} under {root}")
    committed = load_section(name, DATA)  # its columns and title are what the template expects
    kept_columns = spec.kept_columns
    if kept_columns and spec.remeasured and (again := table_rows(spec.remeasured, root)):
        found, kept_columns = keep_columns(found, again, kept_columns, spec.match), ()
    elif kept_columns:
        found = keep_columns(found, committed["tables"]["main"]["rows"], kept_columns, spec.match)
    tables = {t: _table(sub, committed, t, got) for t, sub in spec.tables if (got := table_rows(sub, root))}
    facts = spec.facts(root) if spec.facts else {}
    settings = (spec.settings(root) if spec.settings else {}) | (settings or {})
    kept = carried(committed, settings, kept_columns, measured=(set(tables), set(facts)))
    return write_section_data(
        name,
        found,
        command,
        committed.get("settings", {}) | settings,
        title=committed["title"],
        columns=_columns(spec, committed, found),
        tables=kept.get("tables", {}) | tables,
        facts=kept.get("facts", {}) | facts,
        carried=kept.get("carried"),
        root=data_root,
    )


def _table(spec: Collector, committed: dict, name: str, found: list[dict]) -> dict:
    """Another table of the section: its rows, with the spec's columns or the committed table's."""
    old = committed["tables"].get(name)
    if spec.columns is None and old is not None:
        return {"columns": old["columns"], "rows": found}
    return {"columns": _columns(spec, committed, found) if spec.columns else columns_for(found), "rows": found}


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
    tables, figures or columns of an earlier measurement already, that one's (a section rerun twice names
    the first); settings alone carried over do not make the committed tables older."""
    before = committed.get("carried") or {}
    if not (before.get("tables") or before.get("facts") or before.get("columns")):
        before = {}  # only settings were carried: every table and figure is the committed run's own
    when = before.get("commit") or committed.get("commit") or committed.get("committed_in") or "?"
    return {"measured": before.get("measured") or committed.get("measured"), "commit": when[:12]}


def carried(
    committed: dict,
    settings: dict,
    columns: tuple[str, ...] = (),
    measured: tuple[set[str], set[str]] = (set(), set()),
) -> dict:
    """What a rerun does not remeasure (tables other than the main one and the ``measured`` tables,
    ``columns`` of the main one, figures the prose quotes but the ``measured`` facts, settings the caller
    did not give), kept from the committed data with where it came from (:func:`kept_from`), so the
    section's template still renders and its provenance line says which parts are older."""
    new_tables, new_facts = measured
    tables = {k: v for k, v in committed["tables"].items() if k != "main" and k not in new_tables}
    facts = {k: v for k, v in committed.get("facts", {}).items() if k not in new_facts}
    old_settings = sorted(set(committed.get("settings", {})) - set(settings))
    if not tables and not facts and not old_settings and not columns:
        return {}
    origin = kept_from(committed)
    origin |= {"tables": sorted(tables), "facts": sorted(facts), "settings": old_settings}
    if columns:
        origin["columns"] = list(columns)
    return {"tables": tables, "facts": facts, "carried": origin}


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
