#!/usr/bin/env bash
# Test of the GPU check's Open MPI relocation (ctest mpi_gpu_prefix_relocation): unpacks the
# Open MPI packages of packages.txt with dpkg -x into a temporary prefix, hides this machine's own
# Open MPI in a private mount namespace, builds an MPI program with the prefix's mpicc and runs it
# on 2 ranks with the prefix's mpirun (OPAL_PREFIX and the other OPAL_* variables of
# prefix-env.sh), with no ssh or rsh on the machine. Every rank must find itself in a 2-rank
# world and have loaded libmpi from the prefix; ompi_info must report the prefix's folders; the
# hidden system mpirun must not run.
#
#   tools/gpu/test-relocation.sh        (root; exit 77 = skipped: not root, or no .deb files and
#                                        no Debian mirror to download them from)
# Uses tools/gpu/debs/ when fetch-debs.sh filled it, else downloads the few packages it needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/prefix-env.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

if [ "${1:-}" != --inner ]; then
  [ "$(id -u)" = 0 ] || { echo "SKIP: needs root (unshare -m, mount --bind)"; exit 77; }
  work=$(mktemp -d /tmp/fluxmpi-reloc.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  # The Open MPI group of packages.txt: from its "# -- Open MPI" heading to the next heading.
  mapfile -t pkgs < <(awk '/^# -- Open MPI/ {on = 1; next} /^# --/ {on = 0} on && !/^#/ && NF {print $1}' "$here/packages.txt")
  [ ${#pkgs[@]} -ge 5 ] || fail "packages.txt: no Open MPI group found"
  mkdir -p "$work/debs"
  for p in "${pkgs[@]}"; do
    deb=$(ls "$here/debs/${p}"_*.deb 2>/dev/null | head -n 1 || true)
    [ -n "$deb" ] && cp "$deb" "$work/debs/"
  done
  if [ "$(ls "$work/debs" | wc -l)" -lt ${#pkgs[@]} ]; then
    (cd "$work/debs" && apt-get download "${pkgs[@]}" >/dev/null 2>&1) ||
      { echo "SKIP: no tools/gpu/debs and apt-get download failed (no Debian mirror?)"; exit 77; }
  fi
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/prefix"; done
  gpu_unpack_fixups "$work/prefix"
  echo "unpacked ${#pkgs[@]} packages: ${pkgs[*]}"
  unshare -m --propagation private "$0" --inner "$work" "${pkgs[@]}"
  exit $?
fi

# ---- inside the private mount namespace
work=$2; shift 2
prefix=$work/prefix
echo "hidden from this machine's own Open MPI: $(gpu_hide_system "$@")" || fail "could not hide the system's Open MPI"
# No ssh or rsh either, as on an image without them (orterun's rsh launcher needs one).
for f in /usr/bin/ssh /usr/bin/rsh; do [ -f "$(readlink -f "$f")" ] && mount --bind /tmp/fluxmpi-hidden-empty "$(readlink -f "$f")"; done
# The control: the machine's own mpirun is gone.
if env -i PATH=/usr/bin:/bin mpirun --version >/dev/null 2>&1; then fail "the system mpirun still runs: the hiding did not work"; fi
gpu_prefix_env "$prefix"
[ "$(command -v mpirun)" = "$prefix/usr/bin/mpirun" ] || fail "mpirun is $(command -v mpirun), not the prefix's"
paths=$(ompi_info --path all)
for k in Prefix Libdir Pkglibdir Pkgdatadir Sysconfdir; do
  line=$(echo "$paths" | grep -m1 -E "^ *$k:") || fail "ompi_info --path all has no $k"
  case "$line" in *"$prefix"/*) echo "ompi_info:$line" ;; *) fail "ompi_info reports $line, outside $prefix" ;; esac
done
cat >"$work/hello.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int sum = 0, one = 1;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  char line[4096], lib[4096] = "?";
  FILE* maps = fopen("/proc/self/maps", "r");
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, "libmpi.so")) { sscanf(strchr(line, '/'), "%4095s", lib); break; }
  if (maps) fclose(maps);
  printf("rank %d of %d, allreduce %d, libmpi %s\n", rank, size, sum, lib);
  MPI_Finalize();
  return 0;
}
C
mpicc -o "$work/hello" "$work/hello.c" || fail "the prefix's mpicc could not build an MPI program"
out=$(mpirun -np 2 --oversubscribe --bind-to none "$work/hello" 2>&1) || fail "mpirun -np 2 failed: $out"
echo "$out"
case "$out" in *"couldn't open the help file"*|*"unable to open"*|*"not found"*) fail "a component or help file was looked for outside the prefix" ;; esac
for r in 0 1; do
  echo "$out" | grep -q "^rank $r of 2, allreduce 2, libmpi $prefix/" || fail "rank $r did not run in a 2-rank world on the prefix's libmpi"
done
echo "PASS: Open MPI relocated to $prefix: 2 ranks ran on its libmpi through its mpirun"
