#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: safetensors and GGUF header parsers, config parsers, CLIP
# tokenizer) in a torch-free clang build with AddressSanitizer and UndefinedBehaviorSanitizer,
# and runs each for SECONDS seconds, JOBS targets at a time.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      default: 60 s each, every target
# Environment: BUILD_DIR (default build-fuzz), JOBS (default: number of cores),
#              FUZZ_WORK (where each target's growing corpus is kept; default $BUILD_DIR/fuzz-work).
# A crash, leak, timeout or out-of-memory input is saved as tests/fuzz/regressions/<target>/<kind>-<sha1>
# (replayed by the unit_fuzz_replay_<target> tests of every build); the script then goes on with the
# other targets and exits with 1.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
if [ $# -gt 0 ]; then shift; fi
all_targets=(safetensors_header gguf_header config clip_tokenizer)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all_targets[@]}"); fi
case "$seconds" in
  ''|*[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac

scripts/setup.sh --fuzz
. scripts/lib/ccache.sh
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
FUZZ_WORK=${FUZZ_WORK:-$BUILD_DIR/fuzz-work}

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DFLUXMPI_WITH_TORCH=OFF -DFLUXMPI_BUILD_TESTS=OFF -DFLUXMPI_BUILD_FUZZERS=ON \
  -DFLUXMPI_SANITIZE=address,undefined "${CCACHE_CMAKE_ARGS[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]/#/fuzz_}"

# fuzz_one TARGET: runs one target for $seconds s; its summary goes to $BUILD_DIR/fuzz-TARGET.summary,
# and the exit status says whether it found anything (a crash, or a new file in its regressions).
fuzz_one() {
  local t=$1 seeds=tests/fuzz/corpus/$1 regressions=tests/fuzz/regressions/$1 work=$FUZZ_WORK/$1
  local log=$BUILD_DIR/fuzz-$1.log summary=$BUILD_DIR/fuzz-$1.summary status=0 before after
  rm -f "$summary"
  mkdir -p "$regressions" "$work"
  before=$(ls "$regressions" | wc -l)
  # New interesting inputs go to $work (first directory); the seeds and regressions are read only.
  # -timeout: one input slower than 25 s is a finding too (a parser must not hang).
  if ! ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
      "$BUILD_DIR/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$regressions/" "$work" "$seeds" "$regressions" >"$log" 2>&1; then
    status=1
  fi
  { grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done )" "$log" | sed "s/^/  $t: /" || true; } >"$summary"
  after=$(ls "$regressions" | wc -l)
  if [ "$after" -gt "$before" ]; then
    status=1
    { echo "fuzz.sh: $t: new finding(s) in $regressions (log: $log):"
      ls -t "$regressions" | head -n $((after - before)) | sed 's/^/  /'; } >>"$summary"
  fi
  return $status
}

for t in "${targets[@]}"; do
  [ -d "tests/fuzz/corpus/$t" ] || { echo "fuzz.sh: no seed corpus tests/fuzz/corpus/$t (known targets: ${all_targets[*]})" >&2; exit 2; }
done
# The targets run JOBS at a time, each on its own core for its own $seconds s: the same fuzzing per
# target as one at a time, in a fraction of the wall time (every target is single-threaded).
failed=()
declare -A pid_of=()
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "fuzz.sh: $t for ${seconds} s (seeds: tests/fuzz/corpus/$t, corpus: $FUZZ_WORK/$t)"
  fuzz_one "$t" &
  pid_of[$t]=$!
  running=$((running + 1))
done
for t in "${targets[@]}"; do
  wait "${pid_of[$t]}" || failed+=("$t")
  cat "$BUILD_DIR/fuzz-$t.summary" 2>/dev/null || true
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: $(printf '%s\n' "${failed[@]}" | sort -u | tr '\n' ' ')(see $BUILD_DIR/fuzz-<target>.log)" >&2
  exit 1
fi
echo "fuzz.sh: no crash in ${targets[*]} (${seconds} s each)"
