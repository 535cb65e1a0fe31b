# Sourced by the build scripts: compiler output is cached across builds, clones and CI runs on the
# same machine (ccache, with its directory outside the clone). Paths under the clone are hashed
# relative to it (CCACHE_BASEDIR, CCACHE_NOHASHDIR), so a fresh clone in another folder hits the
# cache of an earlier one; the precompiled libtorch header is included by a relative name for the
# same reason (CMakeLists.txt). Sets CCACHE_CMAKE_ARGS (empty when ccache is not installed).
#   FLUXMPI_CCACHE_DIR   the cache (default /var/cache/fluxmpi/ccache, else ~/.cache/fluxmpi/ccache)
#   FLUXMPI_CCACHE=0     build without the cache
CCACHE_CMAKE_ARGS=()
if [ "${FLUXMPI_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  if [ -z "${FLUXMPI_CCACHE_DIR:-}" ]; then
    FLUXMPI_CCACHE_DIR=/var/cache/fluxmpi/ccache
    mkdir -p "$FLUXMPI_CCACHE_DIR" 2>/dev/null && [ -w "$FLUXMPI_CCACHE_DIR" ] ||
      FLUXMPI_CCACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/fluxmpi/ccache
  fi
  mkdir -p "$FLUXMPI_CCACHE_DIR"
  export CCACHE_DIR=$FLUXMPI_CCACHE_DIR
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-10G}
  CCACHE_CMAKE_ARGS=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
