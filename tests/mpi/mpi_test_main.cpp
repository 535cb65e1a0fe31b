// main() of the MPI test executables: MPI first, then GoogleTest on every rank. Rank 0 prints the
// usual report; the other ranks print only their failures, prefixed with their rank. The exit
// code is non-zero on every rank when any rank failed, so mpiexec reports the failure.

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "mpi_test_main.h"

namespace fluxmpi::test {
namespace {

const parallel::MpiEnv* g_env = nullptr;

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is kept when it starts: OnTestPartResult runs under GoogleTest's own lock,
  // which UnitTest::current_test_info() would take again (a deadlock, not a report).
  void OnTestStart(const testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s failed at %s:%d\n%s\n", rank_, test_.empty() ? "?" : test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

const parallel::MpiEnv& mpi_env() { return *g_env; }

}  // namespace fluxmpi::test

int main(int argc, char** argv) {
  fluxmpi::parallel::MpiEnv env(&argc, &argv);
  fluxmpi::test::g_env = &env;
  testing::InitGoogleTest(&argc, argv);
  if (env.rank() != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new fluxmpi::test::RankFailurePrinter(env.rank()));
  }
  const int local = RUN_ALL_TESTS() == 0 ? 0 : 1;
  const int any = env.agree(local);
  if (env.rank() == 0 && any != 0 && local == 0) std::fprintf(stderr, "[rank 0] tests failed on another rank\n");
  return any;
}
