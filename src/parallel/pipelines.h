#pragma once
/// `--stages S`: the job's P ranks form P/S pipelines of S consecutive ranks (data × pipeline
/// parallelism, as Megatron-LM's data-parallel groups of pipeline stages). Pipeline k is world
/// ranks kS .. kS+S-1; its first rank is its leader (rank 0's part for the images it takes); every
/// pipeline runs the same slice plan over its S ranks (StagePlan of world size S). S = P (the
/// default) is one pipeline: the job as it was before --stages.
///
/// PipelineLayout is the arithmetic (no MPI: --dry-run and the tests use it anywhere);
/// PipelineComms makes the communicators of one rank from it.

#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace fluxmpi::parallel {

class PipelineLayout {
 public:
  /// P ranks in pipelines of `stages` ranks (0: one pipeline of all P). UsageError naming
  /// --stages when it exceeds P or does not divide it.
  static PipelineLayout make(int world_size, int stages);

  int world_size() const { return world_size_; }
  int stages() const { return stages_; }
  int pipelines() const { return world_size_ / stages_; }
  int pipeline_of(int rank) const { return rank / stages_; }
  /// The rank's place in its pipeline: its slice of the plan.
  int stage_of(int rank) const { return rank % stages_; }
  int leader_of_pipeline(int pipeline) const { return pipeline * stages_; }
  bool is_leader(int rank) const { return rank % stages_ == 0; }

  /// The --dry-run lines: one per pipeline with its ranks, the host of each and its leader.
  /// `hosts` holds every rank's host name (empty: not shown).
  std::string table(const std::vector<std::string>& hosts) const;

 private:
  int world_size_ = 1;
  int stages_ = 1;
};

/// The communicators of one rank under a layout. Collective over `world`.
struct PipelineComms {
  PipelineComms(const Communicator& world, const PipelineLayout& layout);
  /// The S ranks of this rank's pipeline, in stage order.
  Communicator pipeline;
  /// The pipeline leaders, in pipeline order (world rank 0 first); empty on the other ranks.
  Communicator leaders;
};

}  // namespace fluxmpi::parallel
