#!/usr/bin/env bash
# A torch-free build of the parsers and tokenizers (fluxmpi_core, fluxmpi_io, fluxmpi_text and the
# sentencepiece shim) with AddressSanitizer and UndefinedBehaviorSanitizer, and their unit tests:
# tests/unit/base/ and the fuzz corpus replays (label unit), run with ctest.
#   scripts/sanitize.sh [ctest args...]
# Environment: BUILD_DIR (default build-sanitize), JOBS (default: number of cores),
#              SANITIZERS (default address,undefined), CC/CXX (default: the system compiler).
# libtorch cannot take part: see docs/reliability.md ("Sanitizers").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/lib/ccache.sh
BUILD_DIR=${BUILD_DIR:-build-sanitize}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLUXMPI_WITH_TORCH=OFF -DFLUXMPI_BUILD_TESTS=ON \
  -DFLUXMPI_SANITIZE="${SANITIZERS:-address,undefined}" "${CCACHE_CMAKE_ARGS[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
# Every report is fatal: a leak, an invalid access, undefined behaviour.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -L unit "$@"
