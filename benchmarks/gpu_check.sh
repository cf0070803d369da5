#!/usr/bin/env bash
# The GPU check (docs/gpu.md): builds ridgescope's Python extension on the GPU machine against
# the torch there, then runs benchmarks/gpu_check.py, which prints PASS/FAIL/SKIP lines and a
# `GPU_CHECK_SUMMARY {json}` line, and writes its files to $OUT (default ./gpu-check-out).
#
#   bash benchmarks/gpu_check_deps.sh        # once, on the development machine (.rs_deps)
#   bash benchmarks/gpu_check.sh [gpu_check.py options, e.g. --only exactness,history]
#
# Needs there: python3 with a CUDA torch and setuptools (torch.utils.cpp_extension, which the
# configure step imports, needs it on Python 3.12), cmake >= 3.18, ninja or make, a C++20
# compiler, the Python headers. Abseil comes from .rs_deps/absl when the machine has none.
# Budget: under 8 minutes in all, the build about 1-2 minutes on 16 cores. Exit status: the
# check's.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

echo "gpu_check: $(uname -m), $($PY --version 2>&1), torch $($PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1)"
command -v nvidia-smi >/dev/null && nvidia-smi -L
echo "gpu_check: $(cmake --version | head -1), $(c++ --version | head -1)"

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DRIDGESCOPE_BUILD_TORCH=ON -DRIDGESCOPE_WITH_CUDA=ON
            "-DPython_EXECUTABLE=$(command -v "$PY")")
if [[ -d .rs_deps/absl ]]; then
  absl_lib=$PWD/.rs_deps/absl/lib/x86_64-linux-gnu
  cmake_args+=("-Dabsl_DIR=$absl_lib/cmake/absl")
  export LD_LIBRARY_PATH=$absl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

build=build/gpu-check
if ! cmake -S . -B "$build" "${generator[@]}" "${cmake_args[@]}" > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "FAIL build: cmake configure failed (full log in OUT/build.log)"
  exit 2
fi
grep -E "ridgescope: (torch|CUDA)" "$OUT/build.log"
if ! cmake --build "$build" --target _C -j "$(nproc)" >> "$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -40
  echo "FAIL build: compile failed (full log in OUT/build.log)"
  exit 2
fi
module=$(find "$build" -name '_C*.so' -not -path '*/pkg/*' -print -quit)
# The package is staged in the build directory (the source tree's python/ is left alone).
rm -rf "$build/pkg" && mkdir -p "$build/pkg"
cp -r python/ridgescope "$build/pkg/"
rm -f "$build/pkg/ridgescope"/_C*.so
cp "$module" "$build/pkg/ridgescope/"
echo "gpu_check: built $(basename "$module") in $(( $(date +%s) - t0 )) s"

export RIDGESCOPE_PKG_DIR=$PWD/$build/pkg
$PY benchmarks/gpu_check.py --out "$OUT" "$@"
rc=$?
echo "gpu_check: done in $(( $(date +%s) - t0 )) s, exit $rc"
exit $rc
