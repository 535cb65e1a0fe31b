#!/usr/bin/env bash
# The launch scripts as users run them: launch/fluxmpi-run on 2 ranks, and the Slurm script under a
# simulated allocation (LAUNCHER=mpirun), first killed mid-denoising, then "requeued": the second
# start must resume the checkpoint and finish every image.
#   launch_scripts_test.sh SOURCE_DIR FLUXMPI MAKE_TINY_MODEL
set -euo pipefail
src=$1 fluxmpi=$2 make_tiny=$3
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# More ranks than cores: Open MPI 4 reads OMPI_MCA_rmaps_base_oversubscribe, Open MPI 5 (PRRTE) the mapping policy.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
fail() { echo "FAIL: $*"; exit 1; }

"$make_tiny" --out "$work/model" --preset tiny >/dev/null 2>&1 || fail "make-tiny-model"

# launch/fluxmpi-run: 2 ranks, 1 thread each.
"$src/launch/fluxmpi-run" -n 2 --threads 1 --bin "$fluxmpi" -- --model "$work/model" --prompt "a kite" \
  --height 64 --width 64 --steps 2 --seed 1 --no-progress -o "$work/run.png" > "$work/run.log" 2>&1 \
  || { cat "$work/run.log"; fail "fluxmpi-run exited non-zero"; }
[ -s "$work/run.png" ] || fail "fluxmpi-run wrote no PNG"
grep -q "fluxmpi\[rank 0/2\]" "$work/run.log" || fail "fluxmpi-run did not start 2 ranks"
# A usage error: fluxmpi's one line, then the launcher's, and no mpirun banner; the exit code is kept.
rc=0; out=$("$src/launch/fluxmpi-run" -n 2 --threads 1 --bin "$fluxmpi" -- --steps 0 2>&1) || rc=$?
[ "$rc" -eq 2 ] || fail "fluxmpi-run after a usage error: exit code $rc, expected 2: $out"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 2 ] || fail "fluxmpi-run after a usage error printed more than 2 lines: $out"
case "$out" in *"UsageError: --steps must be positive, got 0"*"fluxmpi-run: the job failed with exit code 2"*) ;;
  *) fail "fluxmpi-run after a usage error: $out" ;; esac
out=$("$src/launch/fluxmpi-run" -n 3 --threads 2 --gpu --bin "$fluxmpi" --dry -- --prompt x)
case "$out" in *"-np 3 --bind-to none"*"--threads 2 --device cuda --prompt x"*) ;; *) fail "fluxmpi-run --dry: $out" ;; esac

# The Slurm script in a simulated 1-node, 2-task allocation.
printf 'a lighthouse\na red kite over a field\n' > "$work/prompts.txt"
slurm_env=(SLURM_SUBMIT_DIR="$work" SLURM_JOB_ID=4242 SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1
           FLUXMPI_BIN="$fluxmpi" MODEL="$work/model" PROMPTS="$work/prompts.txt" DEVICE=cpu LAUNCHER=mpirun)
# First start: rank 1 is killed at step 2 (as a node failure would).
if env "${slurm_env[@]}" FLUXMPI_FAULT=kill@1:2 bash "$src/launch/slurm/fluxmpi.sbatch" -- --height 64 --width 64 --steps 4 \
     --seed 7 > "$work/first.log" 2>&1; then
  :
fi
[ -f "$work/out-4242/run.h5" ] || { cat "$work/first.log"; fail "the first start left no checkpoint"; }
ls "$work/out-4242/"*.png >/dev/null 2>&1 && fail "a killed job must not leave images"
# Requeued: the same job id, the same command line; the script must resume.
env "${slurm_env[@]}" bash "$src/launch/slurm/fluxmpi.sbatch" -- --height 64 --width 64 --steps 4 --seed 7 \
  > "$work/second.log" 2>&1 || { cat "$work/second.log"; fail "the requeued start failed"; }
grep -q "resuming $work/out-4242/run.h5" "$work/second.log" || fail "the requeued start did not resume"
[ -s "$work/out-4242/image-00000.png" ] && [ -s "$work/out-4242/image-00001.png" ] || fail "images missing after resume"
echo "launch scripts: ok"
