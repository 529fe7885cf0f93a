#!/usr/bin/env bash
# Builds the cpu backend and runs every test. Exits non-zero on any failure.
# Fresh machine: installs the build dependencies first (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh cpu
cd "${GPUBOX_BUILD_DIR:-build}"
ctest --output-on-failure -j "${GPUBOX_TEST_JOBS:-2}" "$@"
