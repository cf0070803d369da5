#!/usr/bin/env bash
# Checks the GIL-free Python frame walker (csrc/torch_python/python_frames.cpp, docs/sites.md) and the
# frame locals reader (csrc/torch_python/python_locals.cpp, docs/categories.md) on every CPython it finds: for each, builds a small extension (scripts/check_python_frames/harness.cpp:
# the walker and the core's recorder and reader, no torch) against that Python's headers and runs
# check.py, which compares the walker's frames with the interpreter's own. No GPU, no torch.
#
#   bash scripts/check_python_frames.sh [python3.10 python3.12 ...]   # default: 3.10 to 3.13 on PATH
#
# Needs: the core built in build/core (bash scripts/test.sh builds it), g++ with C++20, Abseil,
# and each Python's headers. Exit status: 0 when every Python found agrees.
set -uo pipefail
cd "$(dirname "$0")/.."
core=build/core/libridgescope_core.a
[[ -f $core ]] || { echo "no $core: build the core first (cmake -S . -B build/core -DRIDGESCOPE_BUILD_TORCH=OFF && cmake --build build/core)"; exit 2; }
pythons=("$@")
((${#pythons[@]})) || pythons=(python3.10 python3.11 python3.12 python3.13)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rc=0 checked=0
for py in "${pythons[@]}"; do
  command -v "$py" >/dev/null || { echo "SKIP $py: not found"; continue; }
  inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  [[ -f $inc/Python.h ]] || { echo "SKIP $py: no Python.h"; continue; }
  out=$work/$py && mkdir -p "$out"
  if ! g++ -O2 -Wall -shared -fPIC -std=c++20 -I"$inc" -Iinclude -Icsrc/torch -Icsrc/torch_python -Icsrc/core/util \
      scripts/check_python_frames/harness.cpp csrc/torch_python/python_frames.cpp csrc/torch_python/python_locals.cpp "$core" \
      -labsl_hash -labsl_raw_hash_set -labsl_city -labsl_low_level_hash -lpthread -o "$out/pyframes_check$ext"; then
    echo "FAIL $py: the walker does not build"; rc=1; continue
  fi
  if "$py" scripts/check_python_frames/check.py "$out"; then checked=$((checked + 1)); else echo "FAIL $py"; rc=1; fi
done
((checked)) || { echo "no Python was checked"; exit 2; }
exit $rc
