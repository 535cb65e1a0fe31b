// `--stages S`: the P ranks cut into P/S pipelines of S consecutive ranks, each led by its first
// rank; S must divide P (one line naming --stages otherwise); the --dry-run lines list every
// pipeline with its ranks and hosts.

#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/pipelines.h"

namespace fluxmpi::parallel {
namespace {

std::string usage_error(int P, int S) {
  try {
    PipelineLayout::make(P, S);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(PipelineLayout, ConsecutiveRanksLedByTheFirst) {
  const PipelineLayout l = PipelineLayout::make(8, 4);
  EXPECT_EQ(l.pipelines(), 2);
  EXPECT_EQ(l.stages(), 4);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(l.pipeline_of(r), r / 4) << "rank " << r;
    EXPECT_EQ(l.stage_of(r), r % 4) << "rank " << r;
    EXPECT_EQ(l.is_leader(r), r == 0 || r == 4) << "rank " << r;
  }
  EXPECT_EQ(l.leader_of_pipeline(1), 4);
}

TEST(PipelineLayout, DefaultIsOnePipelineOfAllRanks) {
  const PipelineLayout l = PipelineLayout::make(3, 0);
  EXPECT_EQ(l.pipelines(), 1);
  EXPECT_EQ(l.stages(), 3);
  EXPECT_TRUE(l.is_leader(0));
  EXPECT_FALSE(l.is_leader(2));
  const PipelineLayout ones = PipelineLayout::make(3, 1);
  EXPECT_EQ(ones.pipelines(), 3);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(ones.is_leader(r));
}

TEST(PipelineLayout, StagesMustDivideTheRanks) {
  EXPECT_EQ(usage_error(4, 3), "--stages 3 does not divide the 4 ranks of this job into pipelines (use one of 1, 2, 4)");
  EXPECT_EQ(usage_error(2, 4), "--stages 4 exceeds the 2 ranks of this job (a pipeline is S of the job's ranks)");
  EXPECT_EQ(usage_error(1, 2), "--stages 2 exceeds the 1 rank of this job (a pipeline is S of the job's ranks)");
  EXPECT_NO_THROW(PipelineLayout::make(6, 3));
}

TEST(PipelineLayout, DryRunLinesNameRanksAndHosts) {
  const PipelineLayout l = PipelineLayout::make(4, 2);
  const std::string t = l.table({"n1", "n1", "n2", "n3"});
  EXPECT_NE(t.find("pipelines: 2 x 2 ranks (--stages 2)"), std::string::npos) << t;
  EXPECT_NE(t.find("  pipeline 0: ranks 0-1 (leader 0) on n1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  pipeline 1: ranks 2-3 (leader 2) on n2 (rank 2), n3 (rank 3)\n"), std::string::npos) << t;
  const std::string single = PipelineLayout::make(2, 1).table({});
  EXPECT_NE(single.find("  pipeline 1: rank 1 (leader 1)\n"), std::string::npos) << single;
}

}  // namespace
}  // namespace fluxmpi::parallel
