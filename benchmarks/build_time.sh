#!/usr/bin/env bash
# Cold and warm build time of the CPU wheel. Cold: an empty cache (downloads
# the sdist and the binary wheel, builds the base tree). Warm: inputs cached.
# Usage: benchmarks/build_time.sh [runs]   (prints one line per run)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cache=$(mktemp -d) dist=$(mktemp -d)
trap 'rm -rf "$cache" "$dist"' EXIT
python3 apply.py --version >/dev/null   # bootstrap outside the timing
TIMEFORMAT=%R
t() { { time "$@" >/dev/null 2>&1; } 2>&1; }
echo "cold build: $(t python3 apply.py build -q --target cpu --cache-dir "$cache" --dist "$dist") s"
for i in $(seq "$runs"); do
  echo "warm build $i: $(t python3 apply.py build -q --target cpu --cache-dir "$cache" --dist "$dist") s"
done
wheel=$(ls "$dist"/*.whl)
echo "one plain copy of the wheel: $(t cp "$wheel" "$dist/copy.whl") s ($(du -m "$wheel" | cut -f1) MB)"
