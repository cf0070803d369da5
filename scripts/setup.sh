#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine: system packages, the .venv, torch 2.14.1 and the
# build of ridgescope. A second run does nothing that is already done (it rebuilds only when a
# C++ or build file changed).
#
#   bash scripts/setup.sh            what the demo needs: compilers, CMake, Ninja, ccache, Abseil,
#                                    .venv with torch and numpy, the editable build (scripts/demo.sh)
#   bash scripts/setup.sh --tests    and what the tests need: Catch2, Chromium, unzip, pytest,
#                                    Playwright, the integrations' frameworks (scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
[[ "${1:-}" == "--tests" ]] && tests=1

log() { printf '[setup %4ds] %s\n' "$SECONDS" "$*" >&2; }

# 1. Debian packages: compilers, CMake, Ninja, ccache (every configure uses it), Abseil (shared
#    libraries), venv support when the system Python lacks it; for the tests also Catch2 (v2 or
#    v3), Chromium (the HTML report's browser test) and unzip (scripts/test.sh unpacks a libtorch
#    from a torch wheel).
need=()
packages=(g++ cmake ninja-build ccache libabsl-dev)
((tests)) && packages+=(catch2 chromium unzip)
for pkg in "${packages[@]}"; do
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

# 3. torch 2.14.1 and numpy, and the test tools.
# (Its installed version, read from its metadata: importing torch costs 3 s; the last step
# imports it anyway.)
if ! "$py" -c "import sys; from importlib.metadata import version; sys.exit(version('torch').split('+')[0] != '2.14.1')" 2>/dev/null; then
  log "installing torch 2.14.1 (a CUDA build; large on first install)"
  "$py" -m pip install -q --disable-pip-version-check torch==2.14.1
fi
# The editable build (step 4) needs setuptools' PEP 660 support without the old `wheel` package:
# a new venv of Python 3.11 brings setuptools 65.5, whose editable build fails with "invalid
# command 'bdist_wheel'".
if ! "$py" -c "import sys, setuptools; sys.exit(int(setuptools.__version__.split('.')[0]) < 70)" 2>/dev/null; then
  log "installing setuptools>=70.1 and wheel (the editable build)"
  "$py" -m pip install -q --disable-pip-version-check "setuptools>=70.1" wheel
fi
# numpy: the demo needs nothing else, but torch warns at its import without it ("Failed to
# initialize NumPy"), and the demo's output should be ridgescope's alone; rs.estimate's sweep
# fits with it.
if ! "$py" -c "import numpy" 2>/dev/null; then
  log "installing numpy"
  "$py" -m pip install -q --disable-pip-version-check numpy
fi
# The test tools (--tests only), installed while step 4 compiles: pip mostly waits on the disk
# and the network, the compiler on the cores. pip touches neither torch, setuptools nor
# ridgescope here (torch is held by a constraint; the others are already satisfied).
install_test_tools() {
  if ! "$py" -c "import pytest" 2>/dev/null; then
    log "installing pytest"
    "$py" -m pip install -q --disable-pip-version-check pytest
  fi

  # Python's playwright drives the system Chromium (/usr/bin/chromium) in the HTML report test; it
  # never downloads a browser of its own (that would be `playwright install`, which we never run).
  if ! "$py" -c "import playwright.sync_api" 2>/dev/null; then
    log "installing playwright"
    "$py" -m pip install -q --disable-pip-version-check playwright
  fi

  # The frameworks of the integrations' tests (docs/integrations.md): Hugging Face transformers and
  # accelerate, Lightning (both of its packages), TensorBoard, pytest-xdist, IPython (a notebook's
  # cell), diffusers and PEFT (the field trials, tests/python/field), DeepSpeed (ZeRO 1-3 on
  # its CPU accelerator, docs/distributed.md), rich (ridgescope watch's terminal view) and pexpect
  # (its pseudo-terminal test). Pinned versions,
  # installed with torch held where step 3 put it (a pip constraint: pip may never replace torch
  # for them). The tests build their models from configs: no model hub is used.
  integrations=(transformers==5.24.0 accelerate==1.15.0 lightning==2.6.6 pytorch-lightning==2.6.6
                tensorboard==2.21.0 pytest-xdist==3.8.0 ipython==9.18.1 diffusers==0.42.1 peft==0.21.2
                deepspeed==0.19.8 rich==15.0.0 pexpect==4.9.0)
  pinned='import sys; from importlib.metadata import version; sys.exit(any(version(s.split("==")[0]) != s.split("==")[1] for s in sys.argv[1:]))'
  if ! "$py" -c "$pinned" "${integrations[@]}" 2>/dev/null; then
    log "installing the integrations' frameworks: ${integrations[*]}"
    torch_pin="$(mktemp)"
    "$py" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$torch_pin"
    "$py" -m pip install -q --disable-pip-version-check -c "$torch_pin" "${integrations[@]}"
    rm -f "$torch_pin"
  fi
}
tools_pid=""
if ((tests)); then
  tools_log=build/setup-test-tools.log
  mkdir -p build
  install_test_tools > "$tools_log" 2>&1 &
  tools_pid=$!
fi

# 4. Build and install ridgescope (editable) when its native sources changed.
stamp_file=build/.stamp-python
mkdir -p build
stamp=$( (find csrc include cmake -type f -print0 | sort -z | xargs -0 cat; cat CMakeLists.txt setup.py pyproject.toml python/ridgescope/_version.py) | sha256sum | cut -d' ' -f1)
# The module imports (ridgescope._C with torch) once: that check is also the last line's.
ready='import ridgescope._C, ridgescope, torch; print("ridgescope", ridgescope.__version__, "with torch", torch.__version__)'
if [[ ! -f "$stamp_file" || "$(cat "$stamp_file")" != "$stamp" ]] || ! versions=$("$py" -c "$ready" 2>/dev/null); then
  log "building ridgescope (C++ core, torch sources, Python module)"
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$py" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps -e .
  echo "$stamp" > "$stamp_file"
  versions=$("$py" -c "$ready")
fi
if [[ -n "$tools_pid" ]]; then
  wait "$tools_pid" || { cat "$tools_log" >&2; log "installing the test tools failed (above)"; exit 1; }
  grep -h '^\[setup' "$tools_log" >&2 || true
fi
log "ready: $versions"
