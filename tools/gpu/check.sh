#!/usr/bin/env bash
# The one-shot GPU check (tools/gpu/README.md): on a machine with one NVIDIA GPU, a CUDA libtorch
# (PyTorch's wheel), CMake, ninja and gcc, but none of fluxmpi's other libraries and no network,
#   1. unpacks the Debian packages of tools/gpu/packages.txt (fetched by fetch-debs.sh into
#      tools/gpu/debs/) into a private prefix with dpkg -x and relocates Open MPI there,
#   2. configures fluxmpi against the device's libtorch and that prefix, and checks that every
#      library CMake found is the prefix's,
#   3. builds fluxmpi and the tools the check runs with all cores,
#   4. times one transformer forward of the full FLUX.1-dev shape (19 + 38 blocks, random bf16
#      weights, 1024x1024, 512 text tokens) with fluxmpi-bench-matmul --config,
#   5. runs a 4-step `mpirun -np 2 fluxmpi --device cuda` job on the bench model (both ranks
#      share the one GPU),
#   6. builds the test executables,
#   7. runs the unit tests, and the parity tests on the device (FLUXMPI_TEST_DEVICE=cuda: fp32 at
#      the CPU tolerances, the bf16 runs at the bf16 tolerances) against tools/gpu/fixtures/,
# and writes OUTDIR/gpu-check-report.md (what ran, PASS/FAIL/SKIP per step, the numbers) and
# OUTDIR/gpu-check.log (every command's whole output). Each step runs under the time left of a
# total deadline, so the report is written even when a step hangs.
#
#   tools/gpu/check.sh OUTDIR [options]
#     --cpu-dry         everything a CPU machine can run: Debian's CPU libtorch, --device cpu,
#                       a few unit tests, the parity tests on the CPU, the tiny model in the
#                       job; no FLUX.1-dev forward
#     --hide-system     (with --cpu-dry, as root) run inside a private mount namespace in which
#                       this machine's own copies of the shipped packages are hidden, so that
#                       only the prefix can satisfy the build and the MPI job
#     --unpack-all      also unpack the packages marked missing:/missing-lib: where the machine
#                       has those files (to test them on a machine that needs none)
#     --steps LIST      comma list of unpack,configure,build,bench,mpi,unit,parity (default: all;
#                       build covers the tests' executables too)
#     --prefix DIR      the private prefix (default /tmp/fluxmpi-gpu-prefix; emptied first)
#     --build DIR       the build directory (default build-gpu; build-gpuprefix with --cpu-dry)
#     --jobs N          build jobs (default: all cores)
#     --deadline S      seconds for the whole run (default 470)
#     --torch-prefix D  where TorchConfig.cmake lives (default: python3's torch, or Debian's with --cpu-dry)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
usage() { sed -n 2,33p "$0" | sed 's/^# \{0,1\}//'; }

out=""; cpu_dry=0; hide=0; unpack_all=0; steps="unpack,configure,build,unit,parity,bench,mpi"
prefix=/tmp/fluxmpi-gpu-prefix; build=""; jobs=$(nproc); deadline=470; torch_prefix=""
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry) cpu_dry=1; shift ;;
    --hide-system) hide=1; shift ;;
    --unpack-all) unpack_all=1; shift ;;
    --steps) steps=${2:?--steps needs a list}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a folder}; shift 2 ;;
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --deadline) deadline=${2:?--deadline needs seconds}; shift 2 ;;
    --torch-prefix) torch_prefix=${2:?--torch-prefix needs a folder}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "check.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "check.sh: one OUTDIR only ('$out', then '$1')" >&2; exit 2; }; out=$1; shift ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }
for s in ${steps//,/ }; do
  case "$s" in unpack|configure|build|unit|parity|bench|mpi) ;; *) echo "check.sh: unknown step '$s'" >&2; exit 2 ;; esac
done
if [ $hide = 1 ]; then
  [ $cpu_dry = 1 ] || { echo "check.sh: --hide-system is for --cpu-dry runs (it hides this machine's own packages)" >&2; exit 2; }
  if [ -z "${FLUXMPI_GPU_CHECK_HIDDEN:-}" ]; then
    [ "$(id -u)" = 0 ] || { echo "check.sh: --hide-system needs root (unshare -m, mount --bind)" >&2; exit 2; }
    exec unshare -m --propagation private env FLUXMPI_GPU_CHECK_HIDDEN=1 "$0" "${args[@]}"
  fi
fi
[ -n "$build" ] || { [ $cpu_dry = 1 ] && build=$src/build-gpuprefix || build=$src/build-gpu; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
case "$build" in /*) ;; *) build=$src/$build ;; esac
report=$out/gpu-check-report.md
log=$out/gpu-check.log
: >"$log"
t_start=$(date +%s)
. "$here/prefix-env.sh"
prefix_env() { gpu_prefix_env "$prefix"; }
arch=x86_64-linux-gnu
P=$prefix/usr           # the unpacked packages' /usr
L=$P/lib/$arch

# ---------------------------------------------------------------------------------------------
# Report: one table row per step, details below it.
declare -a rows=() details=()
failures=0
row() {  # row STEP STATUS SECONDS NOTE
  rows+=("| $1 | $2 | $3 s | $4 |")
  [ "$2" = FAIL ] && failures=$((failures + 1))
  write_report
}
detail() { details+=("$1"); write_report; }
write_report() {
  {
    echo "# fluxmpi GPU check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$src" diff --quiet 2>/dev/null || echo ' (with local changes)'), mode: $([ $cpu_dry = 1 ] && echo "--cpu-dry$([ $hide = 1 ] && echo ' --hide-system')" || echo GPU), elapsed $(( $(date +%s) - t_start )) s of $deadline s"
    echo
    echo "| step | result | time | note |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    printf '%s\n\n' "${details[@]}"
    echo "Whole output of every command: gpu-check.log beside this file."
  } >"$report"
}
want() { [[ ",$steps," == *",$1,"* ]]; }
left() { echo $(( deadline - ($(date +%s) - t_start) )); }
# [cap=S] run_logged NAME CMD...: runs CMD for at most the time left (and at most S seconds),
# its output into the log (and into $log.part, for the caller to read).
run_logged() {
  local name=$1; shift
  local budget; budget=$(left)
  [ -n "${cap:-}" ] && [ "$cap" -lt "$budget" ] && budget=$cap
  [ "$budget" -gt 5 ] || { echo "== $name: no time left" >>"$log"; return 124; }
  echo "== $name: $*" >>"$log"
  timeout --kill-after=10 "$budget" "$@" >"$log.part" 2>&1
  local rc=$?
  cat "$log.part" >>"$log"; echo "== $name: exit $rc" >>"$log"
  return $rc
}
last_output() { cat "$log.part" 2>/dev/null; }
fence() { printf '```\n%s\n```' "$1"; }

# ---------------------------------------------------------------------------------------------
# The machine.
{
  echo "$(uname -srm); $(. /etc/os-release && echo "$PRETTY_NAME"); glibc $(ldd --version | head -n1 | awk '{print $NF}')"
  echo "$(nproc) cores; $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/GPU: /'
  echo "gcc: $(g++ --version 2>&1 | head -n1); cmake: $(cmake --version 2>&1 | head -n1); ninja: $(ninja --version 2>&1 || echo none)"
  command -v nvcc >/dev/null && echo "nvcc: $(nvcc --version | tail -n2 | head -n1)"
} >"$out/.machine" 2>&1
detail "**Machine.**
$(fence "$(cat "$out/.machine")")"
rm -f "$out/.machine"

# ---------------------------------------------------------------------------------------------
# --hide-system: this machine's own copies of every shipped package (less the conditional ones,
# which are this machine's base libraries), of hdf5-helpers' h5cc and of the alternatives links
# are covered by empty files and folders. A build or a job that falls back to them then fails.
if [ $hide = 1 ]; then
  t0=$(date +%s)
  mapfile -t hide_pkgs < <(grep -v '^[[:space:]]*#' "$here/packages.txt" | awk 'NF && $2 == "always" {print $1}')
  hide_pkgs+=(hdf5-helpers)
  # ssh and rsh too: the GPU image may have neither (Open MPI then needs its isolated launcher).
  : >/tmp/fluxmpi-hidden-empty
  for f in /usr/bin/ssh /usr/bin/rsh; do [ -f "$(readlink -f "$f")" ] && mount --bind /tmp/fluxmpi-hidden-empty "$(readlink -f "$f")" 2>>"$log"; done
  if counts=$(gpu_hide_system "${hide_pkgs[@]}" 2>>"$log"); then
    row hide-system PASS $(( $(date +%s) - t0 )) "this machine's own files of ${#hide_pkgs[@]} packages covered by empty ones: $counts; ssh and rsh hidden"
  else
    row hide-system FAIL $(( $(date +%s) - t0 )) "mount --bind failed (see the log)"
  fi
fi

# ---------------------------------------------------------------------------------------------
# 1. unpack
if want unpack; then
  t0=$(date +%s)
  note=""; status=PASS
  if ! ls "$here"/debs/*.deb >/dev/null 2>&1; then
    status=FAIL; note="no tools/gpu/debs/*.deb: run tools/gpu/fetch-debs.sh on the Debian machine and carry tools/gpu/debs"
  else
    rm -rf "$prefix"; mkdir -p "$prefix"
    unpacked=(); skipped=()
    ldconfig -p >"$out/.ldcache" 2>/dev/null
    while read -r pkg when _; do
      case "$when" in
        always) ;;
        missing:*) [ $unpack_all = 0 ] && [ -e "${when#missing:}" ] && { skipped+=("$pkg"); continue; } ;;
        missing-lib:*) [ $unpack_all = 0 ] && grep -qE "^[[:space:]]+${when#missing-lib:} " "$out/.ldcache" && { skipped+=("$pkg"); continue; } ;;
        *) status=FAIL; note="packages.txt: bad 'when' of $pkg: $when"; break ;;
      esac
      deb=$(ls "$here"/debs/"${pkg}"_*.deb 2>/dev/null | head -n 1)
      [ -n "$deb" ] || { status=FAIL; note="$pkg: no .deb in tools/gpu/debs"; break; }
      dpkg -x "$deb" "$prefix" >>"$log" 2>&1 || { status=FAIL; note="dpkg -x $deb failed"; break; }
      unpacked+=("$pkg")
    done < <(grep -v '^[[:space:]]*#' "$here/packages.txt" | awk 'NF')
    if [ $status = PASS ]; then
      gpu_unpack_fixups "$prefix"
      # zlib1g-dev's libz.so is an absolute link to Debian's /lib/x86_64-linux-gnu/libz.so.1.2.13:
      # it must name the prefix's libz.so.1 where zlib1g was unpacked too, else the image's.
      if [ -L "$L/libz.so" ]; then
        if [ -e "$prefix/lib/$arch/libz.so.1" ]; then ln -sf "../../../lib/$arch/libz.so.1" "$L/libz.so"
        else ln -sf "$(awk '/libz.so.1 .*x86-64/ {print $NF; exit}' "$out/.ldcache")" "$L/libz.so"; fi
      fi
      rm -f "$out/.ldcache"
      prefix_env
      env | grep -E '^(OPAL_|PMIX_|OMPI_|PATH=|LD_LIBRARY_PATH=|PKG_CONFIG)' | sed 's/^/export /;s/=\(.*\)/="\1"/' >"$prefix/env.sh"
      # Every library of the prefix that fluxmpi or mpirun loads must resolve.
      missing=""
      for f in "$L"/libmpi.so.40 "$L"/libopen-rte.so.40 "$L"/libopen-pal.so.40 "$L"/libpmix.so.2 "$L"/libhdf5_serial.so.103 \
               "$L"/libboost_program_options.so.1.74.0 "$L"/libsentencepiece.so.0 "$L"/libsentencepiece_train.so.0 \
               "$L"/libpng16.so.16 "$L"/libicuuc.so.72 "$L"/libicui18n.so.72 "$P"/bin/orterun "$P"/bin/orted \
               "$L"/openmpi/lib/openmpi3/mca_{pml_ob1,btl_vader,btl_self,btl_tcp,pmix_ext3x,ess_hnp,plm_rsh,odls_default}.so; do
        [ -e "$f" ] || { missing+=" ${f#$prefix}(absent)"; continue; }
        nf=$(ldd "$f" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
        [ -z "$nf" ] || missing+=" ${f#$prefix}: $nf;"
      done
      if [ -n "$missing" ]; then status=FAIL; note="unresolved libraries:$missing"; fi
      size=$(du -sh "$prefix" | cut -f1)
      [ $status = PASS ] && note="${#unpacked[@]} packages into $prefix ($size); not needed here: ${skipped[*]:-none}"
      detail "**Unpacked** (${#unpacked[@]}): ${unpacked[*]}. **Skipped, the image has them** (${#skipped[@]}): ${skipped[*]:-none}."
    fi
  fi
  row unpack $status $(( $(date +%s) - t0 )) "$note"
  [ $status = PASS ] || { rm -f "$prefix/env.sh"; unpack_failed=1; }
fi
[ -e "$prefix/env.sh" ] && prefix_env

# ---------------------------------------------------------------------------------------------
# The device's libtorch.
if [ -z "$torch_prefix" ]; then
  if [ $cpu_dry = 1 ]; then torch_prefix=/usr/lib/$arch/cmake
  else torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>>"$log"); fi
fi
# Torch_DIR rather than a CMAKE_PREFIX_PATH entry: Debian's (/usr) would put the machine's own
# libraries beside the prefix's.
torch_hint=(-DCMAKE_PREFIX_PATH="$P;$torch_prefix")
[ -e "$torch_prefix/Torch/TorchConfig.cmake" ] && torch_hint=(-DCMAKE_PREFIX_PATH="$P" -DTorch_DIR="$torch_prefix/Torch")
if [ $cpu_dry = 0 ]; then
  # The CUDA libraries of PyTorch's wheel live in site-packages/nvidia/*/lib, found at run time
  # through libtorch_cuda's RUNPATH; the linker and the test processes find them here too.
  site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>>"$log")
  for d in "$site"/nvidia/*/lib "$site"/nvidia/cu*/lib "$site"/torch/lib; do
    [ -d "$d" ] && case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d ;; esac
  done
  export LD_LIBRARY_PATH
  detail "**libtorch:** $(python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "GPUs", torch.cuda.device_count())' 2>&1 | tail -n 1); CMake prefix ${torch_prefix}"
fi

# ---------------------------------------------------------------------------------------------
# 2. configure
configured=0
if [ "${unpack_failed:-0}" = 1 ]; then row configure SKIP 0 "the unpack failed"
elif want configure; then
  t0=$(date +%s); status=PASS; note=""
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  [ -e "$build/CMakeCache.txt" ] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}\$" "$build/CMakeCache.txt" && rm -rf "$build"
  cuda=()
  if [ $cpu_dry = 0 ]; then
    # Hopper only: the torch config's arch detection would otherwise compile for every arch it knows.
    cuda=(-DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90)
    command -v nvcc >/dev/null && cuda+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$(command -v nvcc)")")")
  fi
  launcher=()
  command -v ccache >/dev/null && [ -n "${CCACHE_DIR:-}" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  if cap=180 run_logged configure cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFLUXMPI_BUILD_TESTS=ON \
       "${launcher[@]}" \
       "${torch_hint[@]}" -DCMAKE_LIBRARY_PATH="$L" -DCMAKE_INCLUDE_PATH="$P/include" \
       -DMPI_C_COMPILER="$P/bin/mpicc" -DMPIEXEC_EXECUTABLE="$P/bin/mpirun" \
       -DHDF5_ROOT="$L/hdf5/serial" -DHDF5_C_COMPILER_EXECUTABLE="" -DICU_ROOT="$P" -DBoost_NO_SYSTEM_PATHS=ON -DBOOST_ROOT="$P" \
       -DPKG_CONFIG_EXECUTABLE="$(command -v pkg-config || command -v pkgconf || echo pkg-config)" "${cuda[@]}"; then
    configured=1
    # Every dependency must come from the prefix (zlib may be the image's own).
    foreign=$(grep -E '^(MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|HDF5_C_INCLUDE_DIR|HDF5_C_LIBRARY_hdf5|HDF5_hdf5_LIBRARY_RELEASE|Boost_DIR|Boost_INCLUDE_DIR|Boost_PROGRAM_OPTIONS_LIBRARY_RELEASE|GTest_DIR|nlohmann_json_DIR|PNG_LIBRARY_RELEASE|PNG_PNG_INCLUDE_DIR|ICU_INCLUDE_DIR|ICU_UC_LIBRARY_RELEASE|ICU_I18N_LIBRARY_RELEASE|SENTENCEPIECE_TRAIN_LIBRARY|pkgcfg_lib_SENTENCEPIECE_sentencepiece|boost_program_options_DIR|boost_headers_DIR)(:[A-Z]+)?=' \
                "$build/CMakeCache.txt" | grep -v "=$prefix/" )
    found=$(grep -E '^(MPI_mpi_LIBRARY|HDF5_C_LIBRARY_hdf5|HDF5_hdf5_LIBRARY_RELEASE|Boost_DIR|GTest_DIR|nlohmann_json_DIR|PNG_LIBRARY_RELEASE|ICU_UC_LIBRARY_RELEASE|SENTENCEPIECE_TRAIN_LIBRARY|Torch_DIR)(:[A-Z]+)?=' "$build/CMakeCache.txt")
    detail "**Found by CMake:**
$(fence "$found")"
    if [ -n "$foreign" ]; then status=FAIL; note="found outside the prefix: $(echo "$foreign" | tr '\n' ' ')"; configured=0
    else note="every dependency from the prefix; torch from ${torch_prefix}"; fi
  else
    rc=$?; status=FAIL; note="cmake failed (exit $rc): $(last_output | grep -m3 -E 'Error|error|not found' | tr '\n' ' ')"
    detail "**Configure failed**, last lines:
$(fence "$(last_output | tail -n 30)")"
  fi
  row configure $status $(( $(date +%s) - t0 )) "$note"
elif [ -e "$build/CMakeCache.txt" ]; then configured=1; fi

# ---------------------------------------------------------------------------------------------
# 3. build: fluxmpi and the tools the check runs first (the job and the forward come before the
# tests, so that a slow build of the tests cannot crowd them out), then the test executables (6).
unit_tests=(unit_partition_test unit_message_header_test unit_parallel_device_test)
parity_tests=(parity_transformer_parity_test parity_vae_parity_test parity_t5_parity_test)
if [ $cpu_dry = 0 ]; then
  unit_tests+=(unit_flux_transformer_test unit_t5_encoder_test unit_vae_decoder_test unit_loader_test unit_pipeline_denoise_test)
fi
targets=(fluxmpi make-tiny-model)
[ $cpu_dry = 0 ] && targets+=(fluxmpi-bench-matmul)
test_targets=("${unit_tests[@]}" "${parity_tests[@]}")
built=0
if want build; then
  t0=$(date +%s)
  if [ $configured = 0 ]; then row build SKIP 0 "not configured"
  elif run_logged build cmake --build "$build" -j "$jobs" --target "${targets[@]}"; then
    built=1
    # Every library that the prefix has must be loaded from it, not from elsewhere on the machine
    # (Debian's CPU libtorch also needs libraries the prefix does not ship, e.g. libhdf5_serial_hl).
    libs=$(ldd "$build/fluxmpi" | awk -v L="$L" '$2 == "=>" { cmd = "test -e " L "/" $1; if (system(cmd) == 0) print }')
    strays=$(echo "$libs" | grep -v "=> $prefix/")
    detail "**fluxmpi loads:**
$(fence "$libs")"
    if [ -n "$strays" ]; then row build FAIL $(( $(date +%s) - t0 )) "fluxmpi loads libraries outside the prefix: $(echo "$strays" | awk '{print $3}' | tr '\n' ' ')"
    else row build PASS $(( $(date +%s) - t0 )) "${#targets[@]} targets with $jobs jobs; fluxmpi loads MPI, HDF5, Boost, PNG, ICU from the prefix"; fi
  else
    rc=$?; row build FAIL $(( $(date +%s) - t0 )) "exit $rc (first errors below)"
    detail "**Build failed**, first errors:
$(fence "$(last_output | grep -m 20 -E -A3 'error|Error' | head -n 40)")"
  fi
elif [ -x "$build/fluxmpi" ]; then built=1; fi

# ---------------------------------------------------------------------------------------------
# 4. one forward of the full FLUX.1-dev transformer, random bf16 weights.
if want bench; then
  t0=$(date +%s)
  if [ $cpu_dry = 1 ]; then row bench SKIP 0 "--cpu-dry: 12 B parameters are for the GPU"
  elif [ $built = 0 ]; then row bench SKIP 0 "not built"
  elif cap=200 run_logged bench "$build/tools/bench/fluxmpi-bench-matmul" --config "$here/flux1-dev-transformer-config.json" \
         --height 1024 --width 1024 --msl 512 --dtype bf16 --device cuda --repeat 3 --threads "$jobs"; then
    row bench PASS $(( $(date +%s) - t0 )) "$(last_output | grep -m1 'transformer forward' | tr -s ' ')"
    detail "**FLUX.1-dev forward** (fluxmpi-bench-matmul --config tools/gpu/flux1-dev-transformer-config.json --height 1024 --width 1024 --msl 512 --dtype bf16 --device cuda --repeat 3):
$(fence "$(last_output | tail -n 12)")"
  else
    rc=$?; row bench FAIL $(( $(date +%s) - t0 )) "exit $rc: $(last_output | tail -n 2 | tr '\n' ' ')"
  fi
fi

# ---------------------------------------------------------------------------------------------
# 5. a 4-step job on 2 ranks through the prefix's mpirun.
if want mpi; then
  t0=$(date +%s)
  if [ $built = 0 ]; then row mpi SKIP 0 "not built"
  else
    work=$build/gpu-check-work; rm -rf "$work"; mkdir -p "$work"
    device=cuda; extra=(); preset=bench
    # --cpu-dry: the tiny model (the bench model takes minutes on a CPU), one thread per rank.
    [ $cpu_dry = 1 ] && { device=cpu; extra=(--threads 1); preset=tiny; }
    if ! cap=90 run_logged make-tiny-model "$build/tools/make_tiny_model/make-tiny-model" --out "$work/model" --preset $preset; then
      row mpi FAIL $(( $(date +%s) - t0 )) "make-tiny-model --preset $preset failed"
    else
      cap=20 run_logged ompi_info ompi_info --path all
      paths=$(last_output | grep -E ' (Prefix|Libdir|Pkglibdir|Sysconfdir|Pkgdatadir):')
      if cap=240 run_logged mpirun mpirun -np 2 --bind-to none --oversubscribe "$build/fluxmpi" --model "$work/model" \
           --prompt "a mountain village at dawn" --height 256 --width 256 --steps 4 --max-sequence-length 128 --seed 1 \
           --device $device "${extra[@]}" --checkpoint "$work/job.h5" -o "$work/job.png" --log-level debug; then
        summary=$(last_output | grep -E 'encode .* s \(peak|denoise' | tail -n 2)
        ranks=$(last_output | grep -o 'rank [0-9]/2' | sort -u | tr '\n' ' ')
        if [ -s "$work/job.png" ] && [ -s "$work/job.h5" ]; then
          row mpi PASS $(( $(date +%s) - t0 )) "mpirun -np 2 fluxmpi --device $device, model --preset $preset: PNG and checkpoint written; ranks seen: $ranks"
        else
          row mpi FAIL $(( $(date +%s) - t0 )) "exit 0 but no PNG or checkpoint"
        fi
        detail "**mpirun job** (prefix's Open MPI, relocated):
$(fence "$paths
$(command -v mpirun) -> $(readlink -f "$(command -v mpirun)")
$(last_output | grep -E 'fluxmpi\[rank|summary|denoise|device|dtype' | head -n 30)")"
      else
        rc=$?; row mpi FAIL $(( $(date +%s) - t0 )) "mpirun exited $rc: $(last_output | grep -m1 -E 'fluxmpi.*(error|Error)|--device' | cut -c1-200)"
        detail "**mpirun job failed:**
$(fence "$paths
$(last_output | tail -n 30)")"
      fi
    fi
  fi
fi

# ---------------------------------------------------------------------------------------------
# 6. build the test executables. A test renamed or removed since these lists were written is
# named, not fatal.
if want build && [ $built = 1 ]; then
  t0=$(date +%s)
  if [ -e "$build/build.ninja" ]; then
    present=(); absent=()
    for t in "${test_targets[@]}"; do
      if ninja -C "$build" -t query "$t" >/dev/null 2>&1; then present+=("$t"); else absent+=("$t"); fi
    done
    test_targets=("${present[@]}")
    [ ${#absent[@]} -eq 0 ] || detail "**Test targets not in this tree** (not built): ${absent[*]}"
  fi
  if run_logged build-tests cmake --build "$build" -j "$jobs" --target "${test_targets[@]}"; then
    row build-tests PASS $(( $(date +%s) - t0 )) "${#test_targets[@]} test executables"
  else
    rc=$?; row build-tests FAIL $(( $(date +%s) - t0 )) "exit $rc (first errors below)"
    detail "**Test build failed**, first errors:
$(fence "$(last_output | grep -m 20 -E -A3 'error|Error' | head -n 40)")"
  fi
fi

# ---------------------------------------------------------------------------------------------
# 7. unit and parity tests (the test executables themselves: ctest would want every target built).
fixtures=$here/fixtures
test_device=cpu; [ $cpu_dry = 0 ] && test_device=cuda
run_gtests() {  # run_gtests STEP EXE...
  local step=$1; shift
  # Parity: the staged fixture subset, and CI=true so that a missing fixture fails. Unit tests: the
  # default fixture tree, which is absent on the GPU machine (the tests that need it skip).
  local fixture_env=(-u CI)
  [ "$step" = parity ] && fixture_env=(FLUXMPI_FIXTURES="$fixtures" CI=true)
  local t0 status=PASS summary="" e exe
  t0=$(date +%s)
  for e in "$@"; do
    exe=$build/tests/$e
    if [ ! -x "$exe" ]; then status=FAIL; summary+="$e: not built; "; continue; fi
    if cap=150 run_logged "$e" env "${fixture_env[@]}" FLUXMPI_TEST_DEVICE=$test_device FLUXMPI_PRINT_ERRORS=1 \
         "$exe" --gtest_brief=1; then
      summary+="$e: $(last_output | grep -E -o '\[  PASSED  \] [0-9]+ test' | grep -o '[0-9]*') passed$(last_output | grep -E -o '\[  SKIPPED \] [0-9]+ test' | grep -o '[0-9]*' | sed 's/^/, /;s/$/ skipped/'); "
    else
      rc=$?
      status=FAIL
      summary+="$e: FAILED (exit $rc, $(last_output | grep -c '^\[  FAILED  \]') failed tests); "
      detail "**$e failed:**
$(fence "$(last_output | grep -E -B2 -A8 'Failure|FAILED|error' | head -n 60)")"
    fi
    measured=$(last_output | grep -E '^  measured' | head -n 40)
    [ -z "$measured" ] || detail "**$e, measured errors** (FLUXMPI_PRINT_ERRORS=1):
$(fence "$measured")"
  done
  row "$step" $status $(( $(date +%s) - t0 )) "$summary"
}
if want unit; then
  if [ $built = 0 ]; then row unit SKIP 0 "not built"; else run_gtests unit "${unit_tests[@]}"; fi
fi
if want parity; then
  if [ $built = 0 ]; then row parity SKIP 0 "not built"
  elif [ ! -e "$fixtures/manifest.json" ]; then row parity FAIL 0 "no tools/gpu/fixtures: run tools/gpu/stage-fixtures.sh and carry tools/gpu/fixtures"
  else run_gtests parity "${parity_tests[@]}"; fi
fi

rm -f "$log.part" "$out/.ldcache"
write_report
echo "check.sh: $failures failed step(s); report: $report"
[ $failures -eq 0 ]
