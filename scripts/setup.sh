#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine: system packages, the .venv, torch 2.14.1 and the
# build of ridgescope. A second run does nothing that is already done (it rebuilds only when a
# C++ or build file changed).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

# 1. Debian packages: compilers, CMake, Ninja, Abseil (shared libraries), Catch2 (v2 or v3),
#    Chromium (the HTML report's browser test), unzip (scripts/test.sh unpacks a libtorch from a
#    torch wheel), and venv support when the system Python lacks it.
need=()
for pkg in g++ cmake ninja-build libabsl-dev catch2 chromium unzip; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
"${PYTHON:-python3}" -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  log "installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. The virtual environment at .venv.
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "${PYTHON:-python3}" -m venv .venv
fi
py=.venv/bin/python

# 3. torch 2.14.1 and the test tools.
if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.14.1')" 2>/dev/null; then
  log "installing torch 2.14.1 (a CUDA build; large on first install)"
  "$py" -m pip install -q --disable-pip-version-check torch==2.14.1
fi
if ! "$py" -c "import pytest, numpy" 2>/dev/null; then
  log "installing pytest and numpy"
  "$py" -m pip install -q --disable-pip-version-check pytest numpy
fi

# Python's playwright drives the system Chromium (/usr/bin/chromium) in the HTML report test; it
# never downloads a browser of its own (that would be `playwright install`, which we never run).
if ! "$py" -c "import playwright.sync_api" 2>/dev/null; then
  log "installing playwright"
  "$py" -m pip install -q --disable-pip-version-check playwright
fi

# 4. Build and install ridgescope (editable) when its native sources changed.
stamp_file=build/.stamp-python
mkdir -p build
stamp=$( (find csrc include cmake -type f -print0 | sort -z | xargs -0 cat; cat CMakeLists.txt setup.py pyproject.toml) | sha256sum | cut -d' ' -f1)
if [[ ! -f "$stamp_file" || "$(cat "$stamp_file")" != "$stamp" ]] || ! "$py" -c "import ridgescope._C" 2>/dev/null; then
  log "building ridgescope (C++ core, torch sources, Python module)"
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$py" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps -e .
  echo "$stamp" > "$stamp_file"
fi
log "ready: $("$py" -c 'import ridgescope, torch; print("ridgescope", ridgescope.__version__, "with torch", torch.__version__)')"
