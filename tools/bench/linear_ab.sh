#!/usr/bin/env bash
# fp32 linear layers: fluxmpi's oneDNN path (models/common/cpu_linear.h) against libtorch's own
# at::linear, whole transformer forwards, the two taking turns process after process.
#   tools/bench/linear_ab.sh MODEL_DIR SIZE [ROUNDS] [BUILD ...]
# MODEL_DIR: a pipeline folder (e.g. tools/bench/peer/peer.py's d3072 under BUILD/peer-bench);
# BUILDs default to `build`, plus `build-debian13` (run through scripts/debian13.sh) when present.
# Prints each process's best forward of 3 (256 text tokens, 2 threads) and the CPU flags and load.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 MODEL_DIR SIZE [ROUNDS] [BUILD ...]" >&2; exit 2; }
model=$1 size=$2 rounds=${3:-3}
shift $(($# < 3 ? $# : 3))
builds=("$@")
if [ ${#builds[@]} -eq 0 ]; then
  builds=(build)
  [ -d build-debian13 ] && builds+=(build-debian13)
fi
echo "CPU flags: $(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  for b in "${builds[@]}"; do
    run=()
    [ "$b" = build-debian13 ] && run=(scripts/debian13.sh)
    for l in onednn libtorch; do
      t=$("${run[@]}" "$b/tools/bench/fluxmpi-bench-matmul" --model "$model" --height "$size" --width "$size" --msl 256 \
            --threads 2 --repeat 3 --dtype fp32 --linear "$l" | grep -oE "transformer forward: [0-9.]+ ms" | grep -oE "[0-9.]+")
      echo "round $r, $b, $l: $t ms"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
