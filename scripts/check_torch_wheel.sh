#!/usr/bin/env bash
# Builds and loads ridgescope against a torch wheel other than .venv's, without touching .venv:
# by default torch 2.11.0+cu130 for CPython 3.12, what the GPU machine has (docs/gpu.md, "Checked
# against torch 2.11"). It downloads the wheel, unpacks it into a throwaway venv of a local
# Python 3.12 (with its headers), copies the working tree as the device tool would (tracked and
# untracked-but-not-ignored files, plus .rs_deps/), and there runs
#   benchmarks/gpu_check.sh --dry-run   the real CMake build of the _C module, CUDA source ON,
#                                       then the module imported with that torch (CPU self-tests)
#   pytest test_cuda_source.py test_track_cpu.py   with that torch and that module
# No GPU is needed; nothing proves the GPU behaviour (that is the GPU check's job).
#
#   bash scripts/check_torch_wheel.sh [TORCH_VERSION] [WORKDIR]    # defaults: 2.11.0 /tmp/rs-torch-<version>
#
# Needs: network access to PyPI (the wheel is about 530 MB), a python3.12 with its headers
# (PY312=..., else python3.12 on PATH, e.g. pyenv's), .venv (its pip downloads, and its nvidia
# CUDA wheels are lent to the other torch so that it imports: both are cu130), cmake, a C++20
# compiler. A second run reuses the download and the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
version=${1:-2.11.0}
work=${2:-/tmp/rs-torch-$version}
py312=${PY312:-$(command -v python3.12 || true)}
log() { printf '[check_torch_wheel] %s\n' "$*" >&2; }

[[ -n "$py312" ]] || { log "no python3.12 (set PY312)"; exit 2; }
"$py312" -c 'import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || { log "$py312 has no Python.h"; exit 2; }
[[ -x .venv/bin/python ]] || { log "no .venv (bash scripts/setup.sh)"; exit 2; }
mkdir -p "$work"

wheel=$(ls "$work"/torch-"$version"-cp312-cp312-*.whl 2>/dev/null | head -1 || true)
if [[ -z "$wheel" ]]; then
  log "downloading torch $version for CPython 3.12 (not installed anywhere)"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d "$work" "torch==$version"
  wheel=$(ls "$work"/torch-"$version"-cp312-cp312-*.whl | head -1)
fi

venv=$work/venv
site=$venv/lib/python3.12/site-packages
if [[ ! -f "$site/torch/version.py" ]]; then
  log "venv with torch $version at $venv"
  rm -rf "$venv"
  "$py312" -m venv "$venv"
  "$venv/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$site"
fi
# torch's own dependencies, setuptools for torch.utils.cpp_extension (which the build imports),
# numpy and pytest for the tests.
if ! "$venv/bin/python" -c "import typing_extensions, sympy, filelock, jinja2, networkx, fsspec, setuptools, numpy, pytest" 2>/dev/null; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    typing_extensions sympy filelock jinja2 networkx fsspec 'setuptools<82' numpy pytest
fi
nvidia=$(.venv/bin/python -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
[[ -n "$nvidia" && ! -e "$site/nvidia" ]] && ln -s "$nvidia" "$site/nvidia"
log "$("$venv/bin/python" -c 'import sys, torch; print("Python", sys.version.split()[0], "torch", torch.__version__)')"

# The working tree as the device tool copies it: no build outputs, .rs_deps carried.
repo=$work/repo
rm -rf "$repo" && mkdir -p "$repo"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
  [[ -e "$f" ]] && printf '%s\0' "$f"
done | xargs -0 cp --parents -t "$repo"
[[ -d .rs_deps ]] && cp -a .rs_deps "$repo/"

cd "$repo"
rc=0
PYTHON=$venv/bin/python OUT=$work/out bash benchmarks/gpu_check.sh --dry-run || rc=$?
log "gpu_check.sh --dry-run: exit $rc (build log: $work/out/build.log)"
[[ $rc == 0 ]] || exit "$rc"
export LD_LIBRARY_PATH=$repo/.rs_deps/absl/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PYTHONPATH=$repo/build/gpu-check/pkg "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/python/test_cuda_source.py tests/python/test_track_cpu.py
log "done: ridgescope builds, imports and passes its CUDA-source tests with torch $version (no GPU)"
cd "$root"
