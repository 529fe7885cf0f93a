#!/usr/bin/env bash
# scripts/build.sh [cpu|cuda] [extra cmake args...]
#   cpu  (default) -> build/       host compiler, Thrust OMP device system; runs the tests
#   cuda           -> build-cuda/  nvcc, sm_90 unless CMAKE_CUDA_ARCHITECTURES is given
# Binaries land in <build>/bin/.
set -euo pipefail
cd "$(dirname "$0")/.."

backend="${1:-cpu}"
shift || true
case "$backend" in
  cpu) build_dir="${GPUBOX_BUILD_DIR:-build}" ;;
  cuda) build_dir="${GPUBOX_BUILD_DIR:-build-cuda}" ;;
  *) echo "usage: scripts/build.sh [cpu|cuda] [cmake args...]" >&2; exit 2 ;;
esac

jobs="${GPUBOX_JOBS:-$(nproc)}"
# GPUBOX_WERROR=1 (CI): the project's warnings are errors.
if [ -n "${GPUBOX_WERROR:-}" ]; then set -- -DGPUBOX_WERROR=ON "$@"; fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DGPUBOX_BACKEND="$backend" \
        -DCMAKE_BUILD_TYPE="${GPUBOX_BUILD_TYPE:-Release}" "$@"
elif (($#)); then
  cmake -S . -B "$build_dir" -DGPUBOX_BACKEND="$backend" "$@"
fi
cmake --build "$build_dir" -j "$jobs"
