#!/usr/bin/env bash
# Runs a command in a Debian 13 "trixie" root file system, made with debootstrap and kept outside
# the clone, so that a Debian 12 machine builds and tests fluxmpi on Debian 13 too (libtorch 2.6,
# Open MPI 5, HDF5 1.14, gcc 14). CI's second lane (.ci/run) uses it.
#   scripts/debian13.sh scripts/test.sh -L unit     # any command, run from the clone's folder
#   scripts/debian13.sh --make                      # only make (or check) the root
# The root is made once and reused: FLUXMPI_DEBIAN13_ROOT (default /var/cache/fluxmpi/debian13-root).
# A root whose debootstrap did not finish (no stamp file) is made anew. The command runs in a
# private mount namespace (unshare) with /proc, /sys, /dev, the clone's parent folder (the clone
# and ../shared beside it, at the same paths) and the compiler cache bound in: the binds vanish
# with the command, whatever way it ends. Needs root (debootstrap, chroot).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
parent=$(dirname "$repo")
root=${FLUXMPI_DEBIAN13_ROOT:-/var/cache/fluxmpi/debian13-root}
stamp=$root/.fluxmpi-root-complete

if [ "$(id -u)" -ne 0 ]; then
  echo "debian13: needs root (debootstrap and chroot)" >&2
  exit 2
fi

# The machine's own Debian mirror (deb822 or one-line sources), else Debian's default.
mirror() {
  local m=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
    m=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

make_root() {
  if [ -f "$stamp" ]; then return; fi
  if ! command -v debootstrap >/dev/null; then
    echo "debian13: installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  local m
  m=$(mirror)
  echo "debian13: making a Debian 13 root in $root from $m (a few minutes, once)"
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  local tmp="$root.partial-$$"
  rm -rf "$tmp"
  # ca-certificates: apt inside may meet https mirrors; the rest is what scripts/setup.sh needs.
  debootstrap --variant=minbase --include=ca-certificates trixie "$tmp" "$m" > "$tmp.log" 2>&1 || {
    echo "debian13: debootstrap failed; its log: $tmp.log" >&2
    tail -5 "$tmp.log" >&2
    exit 1
  }
  rm -f "$tmp.log"
  # Packages must not start services in the root; apt needs the host's name resolution.
  printf '#!/bin/sh\nexit 101\n' > "$tmp/usr/sbin/policy-rc.d"
  chmod +x "$tmp/usr/sbin/policy-rc.d"
  touch "$tmp/.fluxmpi-root-complete"
  mv "$tmp" "$root"
}

make_root
if [ "${1:-}" = "--make" ]; then
  echo "debian13: root ready at $root ($(cat "$root/etc/debian_version"))"
  exit 0
fi
if [ $# -eq 0 ]; then
  echo "usage: scripts/debian13.sh COMMAND [ARGS...] | --make" >&2
  exit 2
fi

. scripts/lib/ccache.sh
cache=${FLUXMPI_CCACHE_DIR:-}
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

# Inside a private mount namespace: bind what the command needs, chroot, run it there.
export FLUXMPI_D13_ROOT=$root FLUXMPI_D13_PARENT=$parent FLUXMPI_D13_REPO=$repo FLUXMPI_D13_CACHE=$cache
exec unshare --mount --propagation private bash -euo pipefail -c '
  r=$FLUXMPI_D13_ROOT
  mount -t proc proc "$r/proc"
  mount --rbind /sys "$r/sys"
  mount --rbind /dev "$r/dev"
  mkdir -p "$r/dev/shm" "$r$FLUXMPI_D13_PARENT"
  mount --bind "$FLUXMPI_D13_PARENT" "$r$FLUXMPI_D13_PARENT"
  if [ -n "$FLUXMPI_D13_CACHE" ]; then
    mkdir -p "$r$FLUXMPI_D13_CACHE"
    mount --bind "$FLUXMPI_D13_CACHE" "$r$FLUXMPI_D13_CACHE"
  fi
  mkdir -p "$r/tmp" && chmod 1777 "$r/tmp"
  repo=$FLUXMPI_D13_REPO
  unset FLUXMPI_D13_ROOT FLUXMPI_D13_PARENT FLUXMPI_D13_REPO FLUXMPI_D13_CACHE
  exec chroot "$r" /usr/bin/env -u LD_LIBRARY_PATH PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd \"\$0\" && exec \"\$@\"" "$repo" "$@"
' debian13 "$@"
