#!/usr/bin/env bash
# Sets everything up, then runs every test: the layer rule, the Catch2 core tests (also from a
# tree without torch), the C++ package and its Catch2 tests with libtorch, the C++ example
# trainer (installed package and add_subdirectory), the C++ package from a plain libtorch, and
# pytest on both cores. Arguments go to pytest.
#
# One build tree, build/py, holds the Python module (scripts/setup.sh builds it), the core tests,
# libridgescope and its tests: each core and torch-layer source is compiled once there. The
# other trees exist because what they check needs them (no torch; a consumer of the installed
# package; add_subdirectory; another libtorch); ccache serves them the objects build/py already
# compiled. Build folders are kept between runs: each is configured once, then rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
section_start=$SECONDS
section() {
  printf '== [%4ds, previous section %ds] %s ==\n' "$((SECONDS - start))" "$((SECONDS - section_start))" "$*"
  section_start=$SECONDS
}
section "set-up (scripts/setup.sh --tests)"
bash scripts/setup.sh --tests

# The plain libtorch of the last C++ section, unpacked meanwhile (disk, not the cores).
bash scripts/libtorch_build.sh --fetch > build/libtorch-fetch.log 2>&1 &
fetch_pid=$!

section "C++ in build/py: the core tests, libridgescope, its Catch2 tests with libtorch, install"
# Configured with the tests and the C++ package once (4 s with torch's CMake files); later
# builds re-configure by themselves when a CMake input changed.
[[ -f build/py/build.ninja ]] && grep -qx 'RIDGESCOPE_BUILD_TESTS:BOOL=ON' build/py/CMakeCache.txt \
  && grep -qx 'RIDGESCOPE_INSTALL_CPP:BOOL=ON' build/py/CMakeCache.txt \
  || cmake -S . -B build/py -DRIDGESCOPE_BUILD_TESTS=ON -DRIDGESCOPE_INSTALL_CPP=ON >/dev/null
cmake --build build/py
ctest --test-dir build/py --output-on-failure
rm -rf build/cpp-install && cmake --install build/py --component cpp --prefix "$PWD/build/cpp-install" >/dev/null

section "C++ core tests from a tree without torch or Python (build/core)"
cmake -S . -B build/core -G Ninja -DRIDGESCOPE_BUILD_TORCH=OFF -DRIDGESCOPE_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/core
ctest --test-dir build/core --output-on-failure

section "C++ example trainer: installed package, then add_subdirectory"
# Configured once (a clean folder the first time); later runs rebuild what changed: CMake
# re-configures by itself when the package's config files or the example's CMakeLists change.
[[ -f build/example/build.ninja ]] || cmake -S examples/cpp -B build/example -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -Dridgescope_DIR="$PWD/build/cpp-install/lib/cmake/ridgescope" >/dev/null
cmake --build build/example
[[ -f build/example-src/build.ninja ]] || cmake -S examples/cpp -B build/example-src -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DRIDGESCOPE_SOURCE_DIR="$PWD" -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build/example-src
(cd build/example && ./train_mlp --out run --steps 2)

section "C++ package from a plain libtorch (the torch 2.13.0 CPU wheel, unpacked), no Python"
wait "$fetch_pid" || { cat build/libtorch-fetch.log; exit 1; }
bash scripts/libtorch_build.sh

section "Python tests (pytest, both cores)"
# worksteal: a worker that runs out of tests takes the other's queued ones, so the run does not
# end on one worker's long tail (measured: 211 s against 233 s for the default scheduling).
RIDGESCOPE_CPP_TRAINER="$PWD/build/example/train_mlp" \
RIDGESCOPE_CPP_CONVNET="$PWD/build/convnet/train_convnet" RIDGESCOPE_CPP_CONVNET_TORCH=2.13.0 \
  .venv/bin/python -m pytest -q -p no:cacheprovider -n "${RIDGESCOPE_TEST_WORKERS:-2}" --dist worksteal tests/python "$@"
section "done"
