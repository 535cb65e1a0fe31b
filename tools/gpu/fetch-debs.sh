#!/usr/bin/env bash
# Downloads (here, on a Debian bookworm machine with the network to Debian's mirrors) the .deb
# files of tools/gpu/packages.txt into tools/gpu/debs/ (git-ignored), for tools/gpu/check.sh to
# unpack on the GPU machine, which has none of them and no network. Prints what it fetched and
# the total size; fails when a package is missing or the total is over the budget, because the
# run tool carries at most 64 MiB (working tree and carried folders together).
#
#   tools/gpu/fetch-debs.sh [--budget-mib N]     (default 50)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
budget_mib=50
while [ $# -gt 0 ]; do
  case "$1" in
    --budget-mib) budget_mib=${2:?--budget-mib needs a number}; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "fetch-debs.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] || { echo "fetch-debs.sh: needs Debian bookworm (this is ${PRETTY_NAME:-unknown})" >&2; exit 2; }
[ "$(dpkg --print-architecture)" = amd64 ] || { echo "fetch-debs.sh: needs amd64 (the GPU machine is x86-64)" >&2; exit 2; }

mapfile -t pkgs < <(grep -v '^[[:space:]]*#' "$here/packages.txt" | awk 'NF {print $1}')
out=$here/debs
rm -rf "$out.tmp"; mkdir -p "$out.tmp"
# apt-get download fetches exactly the named packages (no dependencies), as the candidate version.
(cd "$out.tmp" && apt-get download "${pkgs[@]}") >"$out.tmp/.log" 2>&1 || {
  cat "$out.tmp/.log" >&2; echo "fetch-debs.sh: apt-get download failed (run 'apt-get update' first?)" >&2; exit 1; }
rm -f "$out.tmp/.log"
for p in "${pkgs[@]}"; do
  ls "$out.tmp/${p}_"*.deb >/dev/null 2>&1 || { echo "fetch-debs.sh: $p was not downloaded" >&2; exit 1; }
done
rm -rf "$out"; mv "$out.tmp" "$out"
total=$(du -cb "$out"/*.deb | tail -n 1 | cut -f1)
(cd "$out" && ls -l --block-size=K *.deb | awk '{printf "%8s  %s\n", $5, $9}')
awk -v n="${#pkgs[@]}" -v t="$total" -v d="$out" 'BEGIN {printf "fetch-debs.sh: %d packages, %.1f MiB in %s\n", n, t / 1048576, d}'
if [ "$total" -gt $((budget_mib * 1048576)) ]; then
  echo "fetch-debs.sh: over the budget of $budget_mib MiB" >&2; exit 1
fi
