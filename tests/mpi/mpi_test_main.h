#pragma once
// The MPI environment of an MPI test executable (tests/mpi/mpi_test_main.cpp creates it before
// GoogleTest runs; every rank runs every test).

#include "parallel/mpi_env.h"

namespace fluxmpi::test {

/// The process's MPI environment.
const parallel::MpiEnv& mpi_env();

}  // namespace fluxmpi::test
