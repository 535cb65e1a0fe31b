// fluxmpi: FLUX.1 text-to-image inference over MPI ranks. See README.md and docs/cli.md.
#include <exception>
#include <string>
#include <vector>

#include "app/runner.h"
#include "core/log.h"
#include "parallel/mpi_env.h"

int main(int argc, char** argv) {
  fluxmpi::parallel::MpiEnv env(&argc, &argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  return fluxmpi::app::run_fluxmpi(args, env);
}
