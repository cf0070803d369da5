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

echo "== C++ package: libridgescope, its Catch2 tests (with libtorch), install =="
cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIDGESCOPE_INSTALL_CPP=ON \
  -DRIDGESCOPE_BUILD_TESTS=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python" \
  -DCMAKE_INSTALL_PREFIX="$PWD/build/cpp-install" >/dev/null
cmake --build build/cpp
ctest --test-dir build/cpp --output-on-failure -R ridgescope_torch_tests
rm -rf build/cpp-install && cmake --install build/cpp >/dev/null

echo "== C++ example trainer, from a clean build directory: installed package, then add_subdirectory =="
rm -rf build/example build/example-src
cmake -S examples/cpp -B build/example -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -Dridgescope_DIR="$PWD/build/cpp-install/lib/cmake/ridgescope" >/dev/null
cmake --build build/example
cmake -S examples/cpp -B build/example-src -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DRIDGESCOPE_SOURCE_DIR="$PWD" -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build/example-src
(cd build/example && ./train_mlp --out run --steps 2)

echo "== C++ package from a plain libtorch (the torch 2.13.0 CPU wheel, unpacked), no Python =="
bash scripts/libtorch_build.sh

echo "== Python tests (pytest) =="
RIDGESCOPE_CPP_TRAINER="$PWD/build/example/train_mlp" \
RIDGESCOPE_CPP_CONVNET="$PWD/build/convnet/train_convnet" RIDGESCOPE_CPP_CONVNET_TORCH=2.13.0 \
  .venv/bin/python -m pytest -q -p no:cacheprovider tests/python "$@"
