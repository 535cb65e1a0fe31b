#!/bin/sh
# Measured against predicted on this machine: tools/sim/validate.sh BUILD_DIR [validate.py options]
# (calibrates tools/sim/profiles/local-cpu.json first when it is missing; see validate.py).
set -eu
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [--rounds N] [--calibrate] [--json FILE]" >&2; exit 2; }
build=$1
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/CPU flags: /'
echo
exec python3 "$(dirname "$0")/validate.py" --build "$build" "$@"
