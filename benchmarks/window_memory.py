"""What sliding-window layers could free during live searches (issue 45, item 2), measured on search trees.

A window layer can drop a block's tokens once no live node's window reaches them
(``arbor_runtime/kv/windows.py``). Which tokens those are depends only on the tree's positions, not on
the model's weights: this runs ``arbor-solve`` searches (any model; policy full, so nothing else is
evicted), and after every operation counts, for each window size, the retained tokens outside every
live node's window. Per window it reports, at the step where resident KV peaked and at the worst step,
the share of the retained tokens a window layer no longer reads; a model whose window layers are a
fraction ``f`` of its layers would free ``f`` times that share of its KV bytes (Mistral-7B-v0.1: all
layers, window 4096; Gemma-2: half, 4096; Gemma-3: five in six, 1024 (512 for 1B); gpt-oss: half, 128).

    python -m benchmarks.window_memory experiment=demo policy=full policy.budget_tokens=null

Writes ``docs/data/window-memory/measured.json`` (``--out`` to change) and prints the table. Measured:
``docs/data/window-memory/game24-demo.json`` and ``gsm8k-table1.json`` (docs/usage.md, Models).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

from arbor_cli.build import build, compose_config
from arbor_runtime.kv.windows import reach, window_dead_tokens

WINDOWS = (128, 512, 1024, 4096)
OUT = Path(__file__).resolve().parents[1] / "docs" / "data" / "window-memory" / "measured.json"


def measure(overrides: list[str], windows: tuple[int, ...] = WINDOWS) -> list[dict]:
    """One row per problem and window: resident tokens at the peak step, dead ones there, worst share."""
    setup = build(compose_config(overrides))
    rows = []
    for problem in setup.problems:
        rt = setup.runtime(problem)
        steps: list[tuple[int, dict[int, int]]] = []  # (resident tokens, window -> dead tokens) per op

        def hook(point, account, rt=rt, steps=steps):
            readers = [([a.id for a in n.kv_path()], n.end_pos) for n in rt.memory.nodes.values()]
            reached = reach(rt.store, readers)
            steps.append((rt.store.resident_tokens, {w: window_dead_tokens(rt.store, reached, w) for w in windows}))

        rt.step_hooks.append(hook)
        setup.controller(rt).solve(problem)
        peak, dead_at_peak = max(steps, key=lambda s: s[0])
        for w in windows:
            worst = max(d[w] / r for r, d in steps if r)
            rows.append(
                {"problem": problem.index, "window": w, "peak_resident_tokens": peak,
                 "dead_at_peak": dead_at_peak[w], "share_at_peak": round(dead_at_peak[w] / peak, 4),
                 "worst_share": round(worst, 4), "steps": len(steps)}
            )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="arbor-solve overrides (Hydra syntax)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = measure(args.overrides)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {
        "command": "python -m benchmarks.window_memory " + " ".join(args.overrides),
        "commit": commit,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "seconds": round(time.perf_counter() - start, 1),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        print(
            f"problem {r['problem']:>3}  window {r['window']:>5}: peak {r['peak_resident_tokens']} resident tokens, "
            f"{r['share_at_peak']:.1%} dead there, worst step {r['worst_share']:.1%}"
        )


if __name__ == "__main__":
    main()
