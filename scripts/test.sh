#!/usr/bin/env bash
# Sets everything up, then runs every test: the Catch2 core tests (no torch) and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== C++ core tests (Catch2, no torch) =="
cmake -S . -B build/core -G Ninja -DRIDGESCOPE_BUILD_TORCH=OFF -DRIDGESCOPE_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/core
ctest --test-dir build/core --output-on-failure

echo "== Python tests (pytest) =="
.venv/bin/python -m pytest -q -p no:cacheprovider tests/python "$@"
