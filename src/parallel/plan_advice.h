#pragma once
// The planner's messages when a plan does not fit the budgets: which stage of which rank is over,
// and what would make it fit (partition.cpp). Internal to src/parallel.

#include <cstdint>
#include <map>
#include <string>

#include "parallel/cost_model.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel::detail {

/// "0=16.0 GiB, 1=24.0 GiB"
std::string budgets_text(const std::map<int, uint64_t>& budgets);

/// The stage of `e` (on `rank`) that exceeds `budget`, as "rank 0 decode: 25.5 GiB (VAE
/// activations 3.0 GiB) > 24.0 GiB; <advice>", or "" when none does.
std::string stage_over_budget(const PlanRequest& r, const CostModel& model, int rank, const StageEstimate& e,
                              uint64_t budget, const std::string& note);

/// The clearest reason why no split fits: a rank whose fixed load (plus its lightest possible
/// slice: one block, or every block on 1 rank) already exceeds its budget, else the total.
[[noreturn]] void throw_infeasible(const PlanRequest& r, const CostModel& model);

}  // namespace fluxmpi::parallel::detail
