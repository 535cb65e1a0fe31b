#pragma once
// MPI handles and error checking shared by the .cpp files of src/parallel (the only place that
// includes <mpi.h>). Not part of the public interface.

// The C API only: without these, Open MPI's and MPICH's mpi.h pull in the removed C++ bindings,
// which need a library fluxmpi does not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <functional>
#include <string>

#include "parallel/communicator.h"
#include "parallel/mpi_env.h"

namespace fluxmpi::parallel {

struct Communicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;  ///< MPI_COMM_NULL: no MPI, or this rank is outside the group
  bool mpi = false;               ///< MPI is initialised and `comm` is this object's to free
};

struct MpiEnv::Comms {
  /// A duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN: fluxmpi's traffic cannot match
  /// messages of other libraries, and MPI errors become CommError exceptions. Owned by
  /// MpiEnv::world() (the Communicator), aliased here.
  MPI_Comm world = MPI_COMM_NULL;
  /// The ranks of this node (MPI_COMM_TYPE_SHARED).
  MPI_Comm node = MPI_COMM_NULL;
};

/// Throws CommError "<what> failed on rank r: <MPI error string>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const std::string& what);

/// Completes `request` without busy-polling a core: MPI_Test, then a sleep that doubles from 1 us
/// up to 200 us, until it is done (Open MPI's blocking calls spin, and a rank that waits for a
/// late one would take a core from the ranks that compute beside it). `idle`, when given, runs
/// between a test that found nothing and the pause (Messenger's warm-up). For waits on another
/// rank (headers, barriers, small collectives), not for moving large payloads: Open MPI advances a
/// nonblocking transfer only inside MPI calls.
void wait_quietly(MPI_Request& request, const std::string& what, MPI_Status* status = MPI_STATUS_IGNORE,
                  const std::function<void()>& idle = {});

}  // namespace fluxmpi::parallel
