#!/usr/bin/env bash
# Checkpoints across Debian releases: a job killed mid-denoising on one release (HDF5 1.10 and
# libtorch 1.13 on Debian 12; HDF5 1.14 and libtorch 2.6 on Debian 13) is inspected and resumed on
# the other, in both directions, and the resumed images match an uninterrupted run.
#   scripts/cross_release.sh BUILD_DEBIAN12 BUILD_DEBIAN13
# BUILD_DEBIAN12 is a build of this machine's release, BUILD_DEBIAN13 one made in the Debian 13
# root (scripts/debian13.sh env BUILD_DIR=build-debian13 scripts/test.sh). Run as root (the root's chroot).
set -euo pipefail
cd "$(dirname "$0")/.."
b12=${1:?usage: scripts/cross_release.sh BUILD_DEBIAN12 BUILD_DEBIAN13}
b13=${2:?usage: scripts/cross_release.sh BUILD_DEBIAN12 BUILD_DEBIAN13}
for b in "$b12" "$b13"; do
  [ -x "$b/fluxmpi" ] && [ -x "$b/tools/inspect/fluxmpi-inspect" ] || { echo "cross_release: no fluxmpi build in '$b'" >&2; exit 2; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Inside the clone's build folder, so that the Debian 13 root sees it at the same path.
work=$PWD/build-cross-release
rm -rf "$work"
mkdir -p "$work"
# KEEP=1 keeps the work folder (logs, checkpoints) for a look after a failure.
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

# run RELEASE PROGRAM ARGS...: a program of that release's build, on this machine or in the root.
run() {
  local release=$1 program=$2
  shift 2
  if [ "$release" = 12 ]; then "$b12/$program" "$@"; else scripts/debian13.sh "$b13/$program" "$@"; fi
}
fail() { echo "cross_release: FAIL: $*" >&2; exit 1; }

"$b12/tools/make_tiny_model/make-tiny-model" --out "$work/model" --preset tiny > /dev/null
# fp32: in bf16 the two libtorch versions' kernels round differently (latents ~1e-2 apart).
job=(--model "$work/model" --prompt "a lighthouse at dusk" --num-images 2 --seed 11 --height 64 --width 64
     --steps 4 --dtype fp32 --threads 1 --no-progress)

for writer in 12 13; do
  reader=$((25 - writer))
  dir=$work/from-$writer
  mkdir -p "$dir"
  # The writer's uninterrupted run, and the same job killed at step 2 of its first image.
  run "$writer" fluxmpi "${job[@]}" --checkpoint "$dir/whole.h5" -o "$dir/whole-{i}.png" > "$dir/whole.log" 2>&1 ||
    { cat "$dir/whole.log"; fail "Debian $writer: the uninterrupted run failed"; }
  if FLUXMPI_FAULT=kill@0:2 run "$writer" fluxmpi "${job[@]}" --checkpoint "$dir/run.h5" -o "$dir/run-{i}.png" \
       > "$dir/killed.log" 2>&1; then
    fail "Debian $writer: the run meant to be killed at step 2 finished"
  fi
  [ -f "$dir/run.h5" ] || fail "Debian $writer: the killed run left no checkpoint"
  # The other release reads it (SWMR reader of a file a killed writer left) and continues it.
  run "$reader" tools/inspect/fluxmpi-inspect "$dir/run.h5" --stats > "$dir/inspect.log" 2>&1 ||
    { cat "$dir/inspect.log"; fail "Debian $reader cannot inspect Debian $writer's checkpoint"; }
  grep -q "denoising" "$dir/inspect.log" || { cat "$dir/inspect.log"; fail "Debian $reader: inspect shows no unfinished image"; }
  run "$reader" fluxmpi --resume "$dir/run.h5" -o "$dir/run-{i}.png" --threads 1 --no-progress > "$dir/resume.log" 2>&1 ||
    { cat "$dir/resume.log"; fail "Debian $reader cannot resume Debian $writer's checkpoint"; }
  for i in 00000 00001; do [ -s "$dir/run-$i.png" ] || fail "Debian $reader: the resumed job wrote no run-$i.png"; done
  # Steps made by another libtorch differ in the last bits only (the two builds' embeddings and
  # latents agree within ~1e-5 on the fixtures, their pixels within 1): the tolerance, relative to
  # max(1, max |reference|), is set by one pixel level of the images (1/255 = 0.0039).
  run "$writer" tools/inspect/fluxmpi-inspect "$dir/run.h5" --diff "$dir/whole.h5" --tol 0.004 > "$dir/diff.log" 2>&1 ||
    { cat "$dir/diff.log"; fail "Debian $writer: the job resumed on Debian $reader differs from the uninterrupted run"; }
  echo "cross_release: Debian $writer's killed checkpoint inspected and resumed on Debian $reader"
done
echo "cross_release: ok"
