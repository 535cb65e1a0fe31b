#!/usr/bin/env bash
# Sanitizer builds and their tests (docs/reliability.md, "Sanitizers").
#   scripts/sanitize.sh [ctest args...]
#       torch-free: the parsers and tokenizers (fluxmpi_core, fluxmpi_io, fluxmpi_text and the
#       sentencepiece shim) under AddressSanitizer + UndefinedBehaviorSanitizer, with their unit
#       tests (tests/unit/base/ and the fuzz corpus replays, label unit), run with ctest.
#   scripts/sanitize.sh --torch
#       the torch-using layers: only the test executables of the transformer (and its GGUF
#       weights), the VAE, the step loop, the checkpoint store and the message code (and, under UBSan alone, the T5 tokenizer
#       inside a libtorch process), built from a target list, never `all`.
#       SANITIZERS=undefined (the default here): UBSan alone; sentencepiece keeps its own link
#         namespace (dlmopen), so the tokenizer test runs too.
#       SANITIZERS=address,undefined: ASan + UBSan; the ASan runtime does not support dlmopen,
#         so the tests that load sentencepiece are left out (see docs/reliability.md).
# Environment: BUILD_DIR (default build-sanitize, --torch: build-sanitize-torch[-asan]), JOBS
#              (default: number of cores), SANITIZERS (default address,undefined; --torch:
#              undefined), CC/CXX (default: the system compiler). ccache is used when installed
#              (scripts/lib/ccache.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
torch=0
if [ "${1:-}" = "--torch" ]; then
  torch=1
  shift
fi
scripts/setup.sh
JOBS=${JOBS:-$(nproc)}
. scripts/lib/ccache.sh
launcher=("${CCACHE_CMAKE_ARGS[@]}")
# Every report is fatal: a leak, an invalid access, undefined behaviour.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ "$torch" = 0 ]; then
  BUILD_DIR=${BUILD_DIR:-build-sanitize}
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLUXMPI_WITH_TORCH=OFF -DFLUXMPI_BUILD_TESTS=ON \
    -DFLUXMPI_SANITIZE="${SANITIZERS:-address,undefined}" "${launcher[@]}" >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -L unit "$@"
  exit 0
fi

SANITIZERS=${SANITIZERS:-undefined}
asan=0
case ",$SANITIZERS," in *,address,*) asan=1 ;; esac
if [ "$asan" = 1 ]; then BUILD_DIR=${BUILD_DIR:-build-sanitize-torch-asan}; else BUILD_DIR=${BUILD_DIR:-build-sanitize-torch}; fi
# Transformer, VAE, step loop, checkpoint store (writer, reader, layout, validation), messages, and
# the GGUF transformers (quantized linears dequantized per call).
unit_tests=(unit_flux_transformer_test unit_vae_decoder_test unit_pipeline_denoise_test
            unit_checkpoint_store_test unit_ckpt_format_test unit_checkpoint_validation_test parity_gguf_parity_test)
mpi_tests=(mpi_message_test mpi_message_errors_test)
if [ "$asan" = 0 ]; then
  unit_tests+=(unit_text_with_torch_test)  # T5 tokenizer (sentencepiece, own namespace) + libtorch
fi
# -O1: the sanitizers' checks stay, the build of the libtorch-heavy code gets cheaper than -O2.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DFLUXMPI_WITH_TORCH=ON -DFLUXMPI_BUILD_TESTS=ON -DFLUXMPI_SANITIZE="$SANITIZERS" "${launcher[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${unit_tests[@]}" "${mpi_tests[@]}"

if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
if [ "$asan" = 1 ]; then
  # Leaks inside the uninstrumented libraries (Open MPI, hwloc, libtorch's static registries) are
  # theirs; everything fluxmpi allocates stays checked.
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0}
fi
# The test programs as ctest registers them, JOBS at a time (each runs its cases in one process).
exact() { local IFS='|'; echo "^($*)\$"; }
failed=()
echo "sanitize --torch ($SANITIZERS): ${unit_tests[*]}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -R "$(exact "${unit_tests[@]}")" || failed+=(unit)
# The message tests as registered (mpiexec -n 1, 2, 3). Under ASan without leak detection: Open MPI
# unloads its components before exit, so LeakSanitizer reports what they kept with frames in
# "<unknown module>" that no suppression can name (docs/reliability.md); invalid accesses stay fatal.
mpi_env=()
if [ "$asan" = 1 ]; then mpi_env=("ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0"); fi
env "${mpi_env[@]}" ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -R '^mpi_message' || failed+=(mpi_message)
if [ ${#failed[@]} -gt 0 ]; then
  echo "sanitize --torch ($SANITIZERS): failed: ${failed[*]}" >&2
  exit 1
fi
echo "sanitize --torch ($SANITIZERS): all passed"
