#!/usr/bin/env bash
# The C++ package from a plain libtorch, with no Python found or used (docs/cpp.md), as
# scripts/test.sh runs it:
#   1. the libtorch: the CPU wheel of torch 2.13.0 (`pip download`, from the machine's wheel
#      cache), unpacked with unzip, never installed, into build/libtorch-2.13.0 (kept between runs);
#   2. in build directories configured once (clean the first time), with python trapped on PATH (any run of it fails the
#      script) and -DPython_EXECUTABLE=/nonexistent (any Python lookup fails the configure):
#      configure ridgescope with RIDGESCOPE_BUILD_PYTHON=OFF and only CMAKE_PREFIX_PATH pointing
#      at the libtorch's share/cmake, build, install into build/libtorch-install;
#   3. build examples/cpp_convnet against the install alone (find_package(ridgescope CONFIG
#      REQUIRED) re-finds Torch itself), and run it: build/convnet/train_convnet.
# tests/python/test_cpp_convnet.py checks that binary's report (RIDGESCOPE_CPP_CONVNET).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
version=2.13.0
libtorch=build/libtorch-$version

# 1. The libtorch, unpacked once (the wheel itself is not kept). `--fetch` does only this
#    (scripts/test.sh runs it in the background while it compiles).
if [[ ! -f $libtorch/.complete ]]; then
  rm -rf "$libtorch" && mkdir -p "$libtorch/wheel"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps "torch==$version" -d "$libtorch/wheel"
  unzip -q "$libtorch"/wheel/torch-"$version"*.whl 'torch/include/*' 'torch/lib/*' 'torch/share/*' -d "$libtorch"
  rm -rf "$libtorch/wheel"
  touch "$libtorch/.complete"
fi
[[ "${1:-}" == "--fetch" ]] && exit 0

# 2. No Python from here on: python, python3 and python3.X on PATH record their call and fail.
trap_dir=$root/build/no-python
rm -rf "$trap_dir" && mkdir -p "$trap_dir"
for name in python python3 python3.{9,10,11,12,13,14}; do
  printf '#!/bin/sh\necho "$0 $*" >> "%s/ran"\nexit 1\n' "$trap_dir" > "$trap_dir/$name"
  chmod +x "$trap_dir/$name"
done
export PATH="$trap_dir:$PATH"
unset PYTHONPATH
no_python=(-DPython_EXECUTABLE=/nonexistent -DPython3_EXECUTABLE=/nonexistent)

# Configured once, from a clean folder (its log kept for the line below); later runs rebuild
# what changed (CMake re-configures by itself, still without Python, when a CMakeLists or a
# config file changes).
if [[ ! -f build/libtorch/build.ninja ]]; then
  rm -rf build/libtorch build/libtorch-install build/convnet
  cmake -S . -B build/libtorch -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIDGESCOPE_BUILD_PYTHON=OFF \
    -DCMAKE_PREFIX_PATH="$root/$libtorch/torch/share/cmake" "${no_python[@]}" --no-warn-unused-cli \
    -DCMAKE_INSTALL_PREFIX="$root/build/libtorch-install" >build/libtorch.configure.log 2>&1 \
    || { rm -rf build/libtorch; cat build/libtorch.configure.log; exit 1; }
fi
grep 'ridgescope: torch' build/libtorch.configure.log
cmake --build build/libtorch
cmake --install build/libtorch >/dev/null

# 3. A consumer that knows only the install prefix.
[[ -f build/convnet/build.ninja ]] || cmake -S examples/cpp_convnet -B build/convnet -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$root/build/libtorch-install" "${no_python[@]}" --no-warn-unused-cli >/dev/null
cmake --build build/convnet
(cd build/convnet && ./train_convnet --out run)

# The proof: nothing ran python, and no Python lookup left a trace in either cache.
if [[ -e $trap_dir/ran ]]; then
  echo "libtorch_build.sh: python was run during the build without Python:" >&2
  cat "$trap_dir/ran" >&2
  exit 1
fi
if grep -hiE '^[^#/:]*python[^:]*:' build/libtorch/CMakeCache.txt build/convnet/CMakeCache.txt \
    | grep -vE '^(Python3?_EXECUTABLE:[A-Z]*=/nonexistent|RIDGESCOPE_BUILD_PYTHON:BOOL=OFF)$'; then
  echo "libtorch_build.sh: a Python lookup ran during the build without Python (cache entries above)" >&2
  exit 1
fi
echo "libtorch_build.sh: built, installed and ran against libtorch $version with no Python"
