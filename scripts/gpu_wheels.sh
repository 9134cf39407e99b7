#!/usr/bin/env bash
# Downloads the wheels the GPU machine lacks (scripts/gpu_wheels.txt) for its Python 3.12 on
# manylinux x86-64 into gpu_wheels/ (ignored by git), one --no-deps download a package, and
# prints each wheel's size, their total, and the total with the working tree that travels with a
# device call (at most 64 MiB). Exit status: non-zero when a download fails, a wheel cannot run on
# CPython 3.12 x86-64, a package has not exactly one wheel, or the total is over 64 MiB.
#
#   scripts/gpu_wheels.sh            # then: scripts/gpu_rehearsal.sh, then the device command it prints
#
# Python: $PYTHON, else python3 (its pip only downloads: --python-version picks the wheels).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
DEST=gpu_wheels
LIMIT=$((64 * 1024 * 1024))
PIP=("$PY" -m pip --disable-pip-version-check)
# pip matches manylinux_2_N exactly: name each N a wheel here may use (llguidance: 2_31).
PLAT=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_31_x86_64)

rm -rf "$DEST"
mkdir -p "$DEST"
specs=()
while read -r spec flags; do
  flags="${flags%%#*}"
  specs+=("$spec")
  name="${spec%%==*}"
  if [[ " $flags " == *" build "* ]]; then
    # sdist only on PyPI: build a wheel from it (pure Python, so the same wheel serves 3.12)
    "${PIP[@]}" wheel -q --no-deps --no-binary "$name" -w "$DEST" "$spec" 2>&1 | grep -v "is ignored" || true
  else
    "${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLAT[@]}" -d "$DEST" "$spec" 2>&1 | grep -v "is ignored" || true
  fi
done < <(grep -v '^\s*#' scripts/gpu_wheels.txt | grep -v '^\s*$')

status=0
shopt -s nullglob
for spec in "${specs[@]}"; do
  name="${spec%%==*}"
  version="${spec#*==}"
  stem="$(echo "$name" | tr '.-' '__')"  # wheel file names spell the name with underscores
  found=("$DEST"/"$stem"-"$version"-*.whl)
  if [ ${#found[@]} -ne 1 ]; then
    echo "gpu_wheels: $spec: ${#found[@]} wheels in $DEST/ (want exactly one)" >&2
    status=1
    continue
  fi
  # tags: {python}-{abi}-{platform}; CPython 3.12 on manylinux x86-64 runs py3/cp312/abi3 (<= 3.12) ones
  IFS=- read -r _ _ pytag abitag plattag <<<"$(basename "${found[0]}" .whl)"
  ok=0
  case "$pytag" in py3|py2.py3|cp312) ok=1 ;; cp3?|cp31[0-2]) [ "$abitag" = abi3 ] && ok=1 ;; esac
  case "$plattag" in any|*manylinux*x86_64*) ;; *) ok=0 ;; esac
  if [ $ok -ne 1 ]; then
    echo "gpu_wheels: $(basename "${found[0]}") does not run on CPython 3.12 x86-64" >&2
    status=1
  fi
done
n_whl=$(find "$DEST" -name '*.whl' | wc -l)
if [ "$n_whl" -ne ${#specs[@]} ]; then
  echo "gpu_wheels: $n_whl wheels in $DEST/ for ${#specs[@]} packages" >&2
  status=1
fi

wheels=$(find "$DEST" -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
find "$DEST" -name '*.whl' -printf '%s %f\n' | sort -k2 | awk '{printf "%10.2f MiB  %s\n", $1 / 1048576, $2}'
awk -v w="$wheels" -v t="$tree" -v l="$LIMIT" 'BEGIN {
  printf "%10.2f MiB  wheels (%s)\n%10.2f MiB  the working tree that travels\n%10.2f MiB  together (limit %.0f MiB)\n",
    w / 1048576, "gpu_wheels/", t / 1048576, (w + t) / 1048576, l / 1048576 }'
if [ $((wheels + tree)) -gt $LIMIT ]; then
  echo "gpu_wheels: over the 64 MiB a device call may carry" >&2
  status=1
fi
exit $status
