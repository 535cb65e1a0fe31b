#include "parallel/pipelines.h"


#include "core/error.h"

namespace fluxmpi::parallel {

PipelineLayout PipelineLayout::make(int world_size, int stages) {
  FLUX_CHECK(world_size >= 1, "world size ", world_size);
  if (stages < 0) throw UsageError(str_cat("--stages must be positive, got ", stages));
  PipelineLayout l;
  l.world_size_ = world_size;
  l.stages_ = stages == 0 ? world_size : stages;
  if (l.stages_ > world_size)
    throw UsageError(str_cat("--stages ", stages, " exceeds the ", world_size, " rank", world_size == 1 ? "" : "s",
                             " of this job (a pipeline is S of the job's ranks)"));
  if (world_size % l.stages_ != 0) {
    std::string divisors;
    for (int d = 1; d <= world_size; ++d)
      if (world_size % d == 0) divisors += str_cat(divisors.empty() ? "" : ", ", d);
    throw UsageError(str_cat("--stages ", stages, " does not divide the ", world_size, " ranks of this job into pipelines (use one of ",
                             divisors, ")"));
  }
  return l;
}

std::string PipelineLayout::table(const std::vector<std::string>& hosts) const {
  const bool with_hosts = static_cast<int>(hosts.size()) == world_size_;
  std::string s = str_cat("pipelines: ", pipelines(), " x ", stages_, " rank", stages_ == 1 ? "" : "s",
                          " (--stages ", stages_, "); work groups handed out ",
                          pipelines() == 1 ? "in order to the one pipeline" : "to whichever leader has room",
                          "; every pipeline runs the plan below, its stage r on its r-th rank\n");
  for (int p = 0; p < pipelines(); ++p) {
    const int first = leader_of_pipeline(p), last = first + stages_ - 1;
    s += str_cat("  pipeline ", p, ": rank", stages_ == 1 ? " " : "s ", first, stages_ == 1 ? "" : str_cat("-", last), " (leader ", first, ")");
    if (with_hosts) {
      // "on node1" or "on node1 (ranks 0-1), node2 (ranks 2-3)"
      std::vector<std::pair<std::string, std::vector<int>>> by_host;
      for (int r = first; r <= last; ++r) {
        const std::string& h = hosts[static_cast<size_t>(r)];
        if (by_host.empty() || by_host.back().first != h) by_host.push_back({h, {}});
        by_host.back().second.push_back(r);
      }
      s += " on ";
      for (size_t i = 0; i < by_host.size(); ++i) {
        const auto& [host, ranks] = by_host[i];
        s += str_cat(i ? ", " : "", host);
        if (by_host.size() > 1)
          s += str_cat(" (rank", ranks.size() == 1 ? " " : "s ", ranks.front(), ranks.size() == 1 ? "" : str_cat("-", ranks.back()), ")");
      }
    }
    s += "\n";
  }
  return s;
}

PipelineComms::PipelineComms(const Communicator& world, const PipelineLayout& layout)
    : pipeline(world.split(layout.pipeline_of(world.rank()), world.rank())),
      leaders(world.split(layout.is_leader(world.rank()) ? 0 : -1, world.rank())) {
  FLUX_CHECK(world.size() == layout.world_size(), "a layout of ", layout.world_size(), " ranks on a world of ", world.size());
}

}  // namespace fluxmpi::parallel
