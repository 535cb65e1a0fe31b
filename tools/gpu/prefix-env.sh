# Sourced by check.sh and test-relocation.sh: `gpu_prefix_env PREFIX` points the environment at
# the Debian packages unpacked under PREFIX (dpkg -x): Open MPI relocated there through the
# OPAL_* variables (Debian builds it for /usr, with its libraries and components under
# /usr/lib/x86_64-linux-gnu/openmpi and its MCA defaults in /etc/openmpi), the prefix's programs
# first on PATH, its libraries first on LD_LIBRARY_PATH, pkg-config confined to it.
gpu_prefix_env() {
  local prefix=$1
  local P=$prefix/usr
  local L=$P/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$P
  export OPAL_EXEC_PREFIX=$P OPAL_BINDIR=$P/bin OPAL_LIBDIR=$L/openmpi/lib OPAL_INCLUDEDIR=$L/openmpi/include
  export OPAL_PKGLIBDIR=$L/openmpi/lib/openmpi3 OPAL_DATAROOTDIR=$P/share OPAL_DATADIR=$P/share
  export OPAL_PKGDATADIR=$P/share/openmpi OPAL_SYSCONFDIR=$prefix/etc/openmpi
  # PMIx (Debian: installed for /usr/lib/x86_64-linux-gnu/pmix2) finds its plugins and help texts.
  export PMIX_PREFIX=$L/pmix2 PMIX_EXEC_PREFIX=$L/pmix2 PMIX_LIBDIR=$L/pmix2/lib PMIX_PKGLIBDIR=$L/pmix2/lib/pmix
  export PMIX_DATADIR=$L/pmix2/share PMIX_PKGDATADIR=$L/pmix2/share/pmix
  export PATH=$P/bin:$PATH
  # ($prefix/lib: where zlib1g and libkeyutils1, when unpacked, put their libraries)
  export LD_LIBRARY_PATH=$L:$L/openmpi/lib:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_LIBDIR=$L/pkgconfig:$P/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
  # ob1 over shared memory (no single-copy: containers often refuse process_vm_readv) and TCP;
  # the components that need libfabric, UCX, verbs or PSM are not shipped and not loaded.
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_mtl='^ofi,psm,psm2' OMPI_MCA_osc='^ucx,pt2pt'
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mca_base_component_show_load_errors=0
  # One node: the ranks are started locally, with no ssh/rsh agent (the GPU image may have none,
  # and orterun's rsh launcher refuses to start without one).
  export OMPI_MCA_plm=isolated
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# `gpu_unpack_fixups PREFIX`: the links Debian's alternatives system would make (mpirun, mpicc,
# the multiarch mpi include folder, libmpi.so beside the other libraries).
gpu_unpack_fixups() {
  local P=$1/usr
  for n in mpirun mpiexec; do ln -sf orterun "$P/bin/$n"; done
  for n in mpicc mpicxx mpic++; do ln -sf opal_wrapper "$P/bin/$n"; done
  mkdir -p "$P/include/x86_64-linux-gnu" && ln -sfn ../../lib/x86_64-linux-gnu/openmpi/include "$P/include/x86_64-linux-gnu/mpi"
  ln -sf openmpi/lib/libmpi.so "$P/lib/x86_64-linux-gnu/libmpi.so"
}

# `gpu_hide_system PACKAGE...` (root, inside `unshare -m`): covers this machine's own files of
# those packages with an empty file or folder (hide-system.py picks the folders wholly theirs),
# so that anything that falls back to them fails. Prints "N folders, M files"; non-zero on error.
gpu_hide_system() {
  local here; here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  local list; list=$(mktemp)
  mkdir -p /tmp/fluxmpi-hidden-empty.d && : >/tmp/fluxmpi-hidden-empty
  python3 "$here/hide-system.py" "$@" >"$list" || { rm -f "$list"; return 1; }
  local kind path dirs=0 files=0
  while read -r kind path; do
    case "$kind" in
      dir) mount --bind /tmp/fluxmpi-hidden-empty.d "$path" && dirs=$((dirs + 1)) || { rm -f "$list"; return 1; } ;;
      file) mount --bind /tmp/fluxmpi-hidden-empty "$path" && files=$((files + 1)) || { rm -f "$list"; return 1; } ;;
    esac
  done <"$list"
  rm -f "$list"
  echo "$dirs folders, $files files"
  [ $((dirs + files)) -gt 0 ]
}
