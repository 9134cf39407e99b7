#!/usr/bin/env bash
# The CPU rehearsal of the device run (issue 26): what the GPU machine would do, here, before device
# time is spent on it. It
#   1. makes a virtualenv under /tmp with only what the device's image has that matters here, at the
#      image's versions (scripts/gpu_device_packages.txt) as far as this machine can install them,
#      and fails if anything else landed in it;
#   2. copies the working tree as a device call sends it (tracked and untracked-not-ignored files)
#      plus the carried gpu_wheels/ into a folder, and checks the 64 MiB limit;
#   3. runs, in that folder, the device command itself (scripts/gpu_device_run.sh: the carried wheels
#      installed with --target, then scripts/gpu_check.sh) with --dry-run, `python3` being the
#      virtualenv's;
#   4. prints the exact device call.
# A missing import, a wheel that does not install, or a carried package shadowed by the image's
# fails here.
#
#   scripts/gpu_rehearsal.sh [--fresh]     (run scripts/gpu_wheels.sh first; make gpu-rehearsal does both)
#
# Differences from the device, forced by what installs here without a GPU: CPython 3.11 (the only CPU
# torch on this machine's disk is cp311; the device has 3.12.3), torch 2.13.0+cpu (device: 2.11.0+cu130),
# numpy unpinned (the device's 2.5.2 needs Python >= 3.12), typer < 0.29 (0.29 needs pydantic, which the
# device lacks, so its typer is older). The carried wheels are the device's own (pure Python, or abi3 for
# llguidance), so they install unchanged on 3.11.
# REHEARSAL_DIR (default /tmp/gpu_rehearsal), REHEARSAL_PYTHON (default CPython 3.11), REHEARSAL_TORCH
# (default torch==2.13.0+cpu: always a pinned CPU build, never an unpinned torch). The virtualenv is
# reused while its requirements are unchanged; --fresh rebuilds it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

FRESH=0
[ "${1:-}" = "--fresh" ] && FRESH=1
ROOT="${REHEARSAL_DIR:-/tmp/gpu_rehearsal}"
BASEPY="${REHEARSAL_PYTHON:-}"
if [ -z "$BASEPY" ]; then
  for c in python3.11 /root/.pyenv/versions/3.11*/bin/python3 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      BASEPY="$c"; break
    fi
  done
fi
[ -n "$BASEPY" ] || { echo "gpu_rehearsal: no CPython 3.11 found (set REHEARSAL_PYTHON)" >&2; exit 2; }
TORCH="${REHEARSAL_TORCH:-torch==2.13.0+cpu}"
case "$TORCH" in torch==*+cpu) ;; *) echo "gpu_rehearsal: REHEARSAL_TORCH must pin a CPU build (torch==X+cpu)" >&2; exit 2 ;; esac

shopt -s nullglob
wheels=(gpu_wheels/*.whl)
[ ${#wheels[@]} -gt 0 ] || { echo "gpu_rehearsal: no gpu_wheels/ (run scripts/gpu_wheels.sh)" >&2; exit 2; }

# The device packages this project or its carried wheels import (directly or through their own
# requirements), at the device's versions where known.
MATTER=(transformers tokenizers huggingface-hub accelerate safetensors numpy pyyaml packaging regex typer
        tqdm requests rich networkx sympy pytest hypothesis psutil filelock fsspec jinja2 typing-extensions)
reqs=("$TORCH")
for name in "${MATTER[@]}"; do
  line=$(grep -E "^$name(==|$)" scripts/gpu_device_packages.txt || true)
  [ -n "$line" ] || { echo "gpu_rehearsal: $name is not in scripts/gpu_device_packages.txt" >&2; exit 2; }
  [ "$name" = numpy ] && line=numpy  # 2.5.2 (the device's) has no Python 3.11 wheel
  [ "$name" = typer ] && line="typer<0.29"  # 0.29 needs pydantic, which the device lacks: its typer is older
  reqs+=("$line")
done

VENV="$ROOT/venv"
key="$("$BASEPY" -V 2>&1) ${reqs[*]}"
if [ $FRESH -eq 1 ] || [ ! -f "$VENV/.rehearsal" ] || [ "$(cat "$VENV/.rehearsal")" != "$key" ]; then
  echo "== virtualenv $VENV ($("$BASEPY" -V 2>&1)): ${reqs[*]}"
  rm -rf "$VENV"
  "$BASEPY" -m venv "$VENV"
  printf '%s\n' "$TORCH" > "$ROOT/torch-constraint.txt"  # nothing may resolve another torch
  pipq=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
  "${pipq[@]}" install -c "$ROOT/torch-constraint.txt" "$TORCH" 2>&1 | grep -v "is ignored" || true
  "${pipq[@]}" install -c "$ROOT/torch-constraint.txt" "${reqs[@]}" 2>&1 | grep -v "is ignored" || true
  echo "$key" > "$VENV/.rehearsal"
fi
"$VENV/bin/python" -c "import torch, transformers; print('venv: torch', torch.__version__, '/ transformers', \
transformers.__version__)"

# Only the device's packages (and pip's own) may be in it: anything else would hide a missing wheel.
"$VENV/bin/python" - "$REPO/scripts/gpu_device_packages.txt" <<'PYEOF'
import re
import sys
from importlib.metadata import distributions

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
device = {norm(line.split("==")[0].strip()) for line in open(sys.argv[1]) if line.strip() and not line.startswith("#")}
extra = sorted({norm(d.metadata["Name"]) for d in distributions()} - device - {"pip", "setuptools", "wheel"})
if extra:
    sys.exit(f"gpu_rehearsal: the virtualenv holds packages the device lacks: {', '.join(extra)}")
print(f"venv: every installed package is one the device has ({len(list(distributions()))} distributions)")
PYEOF

# The folder a device call would hold: what travels, plus the carried gpu_wheels/.
COPY="$ROOT/repo"
rm -rf "$COPY"
mkdir -p "$COPY"
git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$COPY"
cp -r gpu_wheels "$COPY/"
size=$(du -sb "$COPY" | cut -f1)
awk -v s="$size" 'BEGIN { printf "carried folder: %.2f MiB of 64 MiB\n", s / 1048576 }'
[ "$size" -le $((64 * 1024 * 1024)) ] || { echo "gpu_rehearsal: over 64 MiB" >&2; exit 1; }

echo "== device command, --dry-run, in $COPY"
rm -rf "$ROOT/out" && mkdir -p "$ROOT/out"
(cd "$COPY" && env -u PYTHONPATH -u VIRTUAL_ENV PATH="$VENV/bin:$PATH" OUT="$ROOT/out" GPU_SITE="$ROOT/site" \
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" bash scripts/gpu_device_run.sh --dry-run)

echo "== rehearsal passed; results in $ROOT/out/. The device call (carry: gpu_wheels):"
echo "run(command='bash scripts/gpu_device_run.sh', carry=['gpu_wheels'], timeout_s=540)"
