#!/usr/bin/env bash
# The README's demo command: on a fresh Debian machine, installs what is missing, builds fluxmpi,
# makes the tiny demo model (random weights, self-made tokenizers: nothing is downloaded) and runs
#   mpirun -np 2 fluxmpi --config config/tiny.ini
# which writes demo/tiny.png and the HDF5 checkpoint demo/tiny.h5.
# Environment: BUILD_DIR (default build), RANKS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
RANKS=${RANKS:-2}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target fluxmpi make-tiny-model fluxmpi-inspect
if [ ! -f demo/tiny-flux/model_index.json ]; then
  rm -rf demo/tiny-flux
  "$BUILD_DIR"/tools/make_tiny_model/make-tiny-model --out demo/tiny-flux --preset tiny
fi
rm -f demo/tiny.h5 demo/tiny.png   # the checkpoint is never overwritten: a fresh demo starts anew
launch/fluxmpi-run -n "$RANKS" --threads 1 --bin "$BUILD_DIR/fluxmpi" -- --config config/tiny.ini
"$BUILD_DIR"/tools/inspect/fluxmpi-inspect demo/tiny.h5
echo "demo: wrote demo/tiny.png and demo/tiny.h5"
