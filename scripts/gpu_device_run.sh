#!/usr/bin/env bash
# The device run (issue 26), as the GPU machine runs it: install the carried wheels (gpu_wheels/,
# from scripts/gpu_wheels.sh) into a target folder ahead of the image's own packages, print what
# the import path resolves to, then scripts/gpu_check.sh. The CPU rehearsal
# (scripts/gpu_rehearsal.sh) runs this same script with --dry-run, `python3` being its virtualenv's.
#
#   bash scripts/gpu_device_run.sh [--dry-run] [--out DIR]     (DIR: default $OUT, else gpu_check_out)
#
# GPU_SITE: the target folder (default /tmp/site). Nothing is fetched: pip installs from the
# carried files alone (--no-index --no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=()
OUTDIR="${OUT:-gpu_check_out}"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=(--dry-run); shift ;;
    --out) OUTDIR="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (use --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
done
SITE="${GPU_SITE:-/tmp/site}"

shopt -s nullglob
wheels=(gpu_wheels/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "gpu_device_run: no wheels in gpu_wheels/ (run scripts/gpu_wheels.sh, and carry gpu_wheels)" >&2
  exit 2
fi
rm -rf "$SITE"
python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$SITE" "${wheels[@]}"
export PYTHONPATH="$SITE"
export PYTHON=python3 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1  # nothing outside the machine can be reached

# Every package the run imports, and where it comes from (the carried ones must come from $SITE).
python3 - "$SITE" <<'PYEOF'
import importlib
import sys
from importlib.metadata import packages_distributions, version

site = sys.argv[1]
print(f"python {sys.version.split()[0]} at {sys.executable}")
dists = packages_distributions()
carried = ("hydra", "omegaconf", "antlr4", "llguidance", "gguf", "transformers")
for name in carried + ("torch", "tokenizers", "huggingface_hub", "accelerate", "safetensors", "numpy", "rich"):
    mod = importlib.import_module(name)
    where = "carried" if mod.__file__.startswith(site) else "image"
    v = getattr(mod, "__version__", None) or version(dists[name][0])  # the first on sys.path: the one imported
    print(f"  {name:16} {v:14} {where}")
    if name in carried and where != "carried":
        sys.exit(f"gpu_device_run: {name} resolved to {mod.__file__}, not the carried {site}")
# what the run imports, whole: the runtime, the CLI (Hydra), grammar sampling, the check itself
for name in ("arbor_runtime", "arbor_cli.solve", "benchmarks.gpu_check", "llguidance.hf",
             "arbor_runtime.controllers", "arbor_runtime.tasks", "arbor_runtime.verifiers"):
    importlib.import_module(name)
PYEOF

bash scripts/gpu_check.sh ${DRY[@]+"${DRY[@]}"} --out "$OUTDIR"
