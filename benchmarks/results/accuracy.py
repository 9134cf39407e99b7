"""The accuracy section's data from the run dirs of scripts/bench_accuracy.sh.

    python -m benchmarks.results.accuracy bench/accuracy --command "bash scripts/bench_accuracy.sh ..."

One row per (propose mode, policy, budget) run: puzzles solved out of how many (the page adds the
95% Wilson interval), OOMs, peak device KV tokens, mean seconds of the runs that did not OOM.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .data import DATA, load_section, write_section_data

MODES = (
    ("io", "IO (one greedy path)"),
    ("cot", "CoT-style single sample"),
    ("tot_sample", "ToT BFS, sampled steps"),
    ("tot_legal", "ToT BFS, legal steps ranked by rt.choose"),
    ("oracle", "ToT BFS, legal steps ranked by rt.choose"),
)
POLICY_ORDER = {"full": 0, "arbor": 1, "h2o": 2, "streaming": 3}


def _order(name: str) -> tuple:
    policy, _, ratio = name.partition("-")
    return (POLICY_ORDER.get(policy, 9), -float(ratio) if ratio else 0.0)


def rows(root: Path) -> list[dict]:
    """One row per run dir ``root/<mode>/<policy>[-<ratio>]/results.jsonl``."""
    out = []
    for mode, label in MODES:
        for path in sorted((root / mode).glob("*/results.jsonl"), key=lambda p: _order(p.parent.name)):
            results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if not results:
                continue
            policy, _, ratio = path.parent.name.partition("-")
            verifier = results[0].get("verifier", "")
            if results[0].get("verifier_label"):
                verifier += f": {results[0]['verifier_label']}"
            ran = [r for r in results if not r.get("oom")]
            out.append({
                "mode": label, "verifier": verifier, "policy": policy,
                "budget": f"{ratio}x full peak" if ratio else "none",
                "oom": sum(bool(r.get("oom")) for r in results),
                "peak_kv_tok": max((int(r.get("peak_device_tokens") or 0) for r in results), default=0),
                "mean_s_runs": round(sum(float(r.get("seconds") or 0) for r in ran) / len(ran), 4) if ran else None,
                "solved": sum(bool(r.get("solved")) for r in results),
                "problems": len(results),
                "indices": sorted(int(r["index"]) for r in results),
            })  # fmt: skip
    return out


def write(root: Path, command: str, data_root: Path | None = None) -> Path:
    """Write docs/data/accuracy/results.json from ``root``'s runs, keeping the committed columns and title."""
    found = rows(root)
    if not found:
        raise SystemExit(f"accuracy: error: no */results.jsonl under {root}/<mode>/")
    indices = sorted({i for r in found for i in r.pop("indices")})
    template = load_section("accuracy", DATA)  # the columns and title the page's template expects
    return write_section_data(
        "accuracy",
        found,
        command,
        {"modes": sorted({r["mode"] for r in found}), "model": "SmolLM2-135M-Instruct"},
        title=template["title"],
        columns=template["tables"]["main"]["columns"],
        facts={"first_row": indices[0], "last_row": indices[-1]},
        root=data_root,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, help="OUT_DIR of scripts/bench_accuracy.sh")
    ap.add_argument("--command", required=True, help="the command that produced the runs (recorded)")
    ap.add_argument("--data-root", type=Path, default=None, help="docs/data by default")
    args = ap.parse_args(argv)
    print(f"wrote {write(args.runs, args.command, args.data_root)}")


if __name__ == "__main__":
    main()
