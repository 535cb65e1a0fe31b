// A job in which the last rank fails after start-up while the other ranks wait for it. The job
// must end within seconds of the failure, with the failing rank's exit code and its one-line
// report (tests/mpi/expect_abort.cmake checks all three). Scenarios:
//   recv        rank 0 blocks in Messenger::recv for the failing rank's message; main catches the
//               error, reports it and calls MpiEnv::abort (what fluxmpi's main does)
//   collective  the others block in agree(); same handling
//   unwind      the error is not caught while the MpiEnv lives: its destructor aborts the job

#include <cstdio>
#include <ctime>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "parallel/message.h"
#include "parallel/mpi_env.h"

namespace {

using namespace fluxmpi;

void run(const parallel::MpiEnv& env, const std::string& scenario) {
  env.barrier();  // start-up is over
  const int failing = env.size() - 1;
  if (env.rank() == failing) {
    // expect_abort.cmake measures from here to the end of the job.
    std::fprintf(stderr, "abort_probe: rank %d fails at unix time %lld\n", failing, static_cast<long long>(std::time(nullptr)));
    std::fflush(stderr);
  }
  if (scenario == "recv") {
    parallel::Messenger messenger(env);
    if (env.rank() == failing) throw WeightError("probe: the last rank fails while rank 0 waits for its message");
    if (env.rank() == 0) {
      parallel::MessageHeader expected;
      expected.tag = parallel::MessageTag{parallel::MessageKind::NoisePred, 0, 0, 0};
      expected.tensors = {parallel::TensorSpec{at::kFloat, {1, 16, 64}}};
      messenger.recv(failing, expected, at::kCPU);
    }
  } else if (scenario == "collective" || scenario == "unwind") {
    if (env.rank() == failing) throw CommError("probe: the last rank fails while the others are in a collective");
    env.agree(kExitOk);
  } else {
    throw UsageError("abort_probe: scenario must be recv, collective or unwind, got '" + scenario + "'");
  }
  env.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "unwind") {
    try {
      parallel::MpiEnv env(&argc, &argv);
      run(env, scenario);
    } catch (const Error& e) {
      log::report(e);  // not reached on the failing rank: the environment aborted the job
    }
    return 0;
  }
  parallel::MpiEnv env(&argc, &argv);
  try {
    run(env, scenario);
  } catch (const Error& e) {
    log::report(e);
    env.abort(e.exit_code());
  }
  return 0;
}
