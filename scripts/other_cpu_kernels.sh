#!/usr/bin/env bash
# The ATEN_CPU_CAPABILITY to run the exactness tests under a second time: another set of CPU kernels than
# the one torch picks by default here (avx2 on an AVX-512 CPU; the scalar "default" on an AVX2 one).
#   bash scripts/other_cpu_kernels.sh [PYTHON]
set -euo pipefail
PY=${1:-python3}
case "$("$PY" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" in
  AVX512*) echo avx2 ;;
  *) echo default ;;
esac
