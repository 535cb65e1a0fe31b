#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test suite.
#   scripts/test.sh [ctest args...]      e.g. scripts/test.sh -L parity
# Environment: BUILD_DIR (default build), JOBS (default: number of cores),
#              FLUXMPI_FIXTURES (fixture tree; default ../shared/fixtures).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/lib/ccache.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DFLUXMPI_BUILD_TESTS=ON "${CCACHE_CMAKE_ARGS[@]}"
cmake --build "$BUILD_DIR" -j "$JOBS"
# Open MPI refuses root unless told; CI runs as root.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Most of the tests' time is spent starting processes that load libtorch (about 770 fluxmpi ranks
# and 190 test programs per run), a fifth of each start in page faults of malloc's heap: with the
# heap in huge pages a rank starts in about 0.8x the time. Values do not change
# (docs/reliability.md, "Test processes").
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 1800 -j "$JOBS" "$@"
