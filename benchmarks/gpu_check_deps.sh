#!/usr/bin/env bash
# Prepares, on the development machine, what the GPU machine lacks for benchmarks/gpu_check.sh:
# Abseil (headers, shared libraries and CMake config), copied from this machine's Debian package
# libabsl-dev into .rs_deps/absl with the same relative layout, so its CMake config resolves
# there. .rs_deps/ is ignored locally (.git/info/exclude) and travels with the `run` tool's
# `carry: [".rs_deps"]`. About 6 MB. Run from anywhere; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

arch_dir=/usr/lib/x86_64-linux-gnu
if [[ ! -f $arch_dir/cmake/absl/abslConfig.cmake || ! -d /usr/include/absl ]]; then
  echo "gpu_check_deps: Abseil is not installed here (apt-get install libabsl-dev)" >&2
  exit 1
fi
dest=.rs_deps/absl
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib/x86_64-linux-gnu/cmake"
cp -a /usr/include/absl "$dest/include/"
cp -a "$arch_dir"/libabsl_*.so* "$dest/lib/x86_64-linux-gnu/"
cp -a "$arch_dir/cmake/absl" "$dest/lib/x86_64-linux-gnu/cmake/"
grep -qxF '/.rs_deps/' .git/info/exclude 2>/dev/null || echo '/.rs_deps/' >> .git/info/exclude
echo "gpu_check_deps: $(du -sh .rs_deps | cut -f1) in .rs_deps (Abseil $(ls "$dest"/lib/x86_64-linux-gnu/libabsl_base.so.* | head -1 | sed 's/.*\.so\.//'))"
