#!/usr/bin/env bash
# Installs the Debian packages fluxmpi needs to build, test and run, when they are missing.
# Supported: Debian 12 "bookworm" and Debian 13 "trixie" (the package names below exist on both).
#   scripts/setup.sh            build + test + run dependencies
#   scripts/setup.sh --fuzz     also clang and its sanitizer runtimes (fuzzing)
set -euo pipefail

release=unknown
if [ -r /etc/os-release ]; then
  release=$(. /etc/os-release && echo "${ID:-}-${VERSION_CODENAME:-}")
fi
case "$release" in
  debian-bookworm | debian-trixie) ;;
  *) echo "setup: warning: '$release' is not a tested release (Debian 12 bookworm, Debian 13 trixie); trying anyway" >&2 ;;
esac

packages=(
  build-essential cmake pkg-config git
  ccache                                 # compiler output cached across builds and CI runs (scripts/lib/ccache.sh)
  mold                                   # links about ten times faster than GNU ld (CMakeLists.txt, FLUXMPI_LINKER)
  libtorch-dev libopenblas0-openmp       # tensor math; OpenBLAS (OpenMP) instead of the ~25x slower reference BLAS
  libopenmpi-dev openmpi-bin             # MPI
  libhdf5-dev hdf5-tools                 # checkpoints; h5dump/h5ls/h5clear
  libsentencepiece-dev                   # T5 tokenizer (and its trainer for the demo model)
  libboost-program-options-dev           # command line and INI files
  nlohmann-json3-dev libgtest-dev libgmock-dev
  libpng-dev libjpeg-dev libwebp-dev     # input images (PNG, JPEG through libjpeg-turbo, WebP)
  libicu-dev                             # CLIP tokenizer: NFC, Unicode lower-casing and regex
  python3-numpy python3-h5py python3-pil # ../shared/tools/check-cli.sh and the HDF5 examples
)
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-dev)     # the release's default clang and its sanitizer runtimes
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's libblas.so.3 alternative must point at OpenBLAS, not the reference BLAS.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
case "$blas" in
  *openblas*) ;;
  *) echo "setup: warning: libblas.so.3 resolves to '$blas', not OpenBLAS: matmuls will be slow" >&2 ;;
esac
echo "setup: all packages present"
