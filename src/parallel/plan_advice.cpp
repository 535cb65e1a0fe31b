#include "parallel/plan_advice.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"

namespace fluxmpi::parallel::detail {

namespace {

// " or use a smaller --dtype" where there is a smaller one to use.
std::string dtype_advice(const PlanRequest& r) { return r.dtype_bytes > 2 ? " or use --dtype bf16" : ""; }

// What would make the decode stage smaller.
std::string decode_advice(const PlanRequest& r, const CostModel& model) {
  std::string s;
  if (!r.vae_tiling && model.tiling_applies()) s += "use --vae-tiling, ";
  if (!r.vae_slicing && r.microbatch > 1) s += "use --vae-slicing, ";
  return s + "raise the budget" + dtype_advice(r) + " or make smaller images";
}

}  // namespace

std::string budgets_text(const std::map<int, uint64_t>& budgets) {
  std::string s;
  for (const auto& [rank, bytes] : budgets) s += str_cat(s.empty() ? "" : ", ", rank, "=", format_bytes(bytes));
  return s;
}

std::string stage_over_budget(const PlanRequest& r, const CostModel& model, int rank, const StageEstimate& e,
                              uint64_t budget, const std::string& note) {
  const std::string limit = str_cat(" > ", format_bytes(budget), note);
  // The blocks' own stage first (its weights are what more ranks spread), then the stages
  // only rank 0 has.
  if (e.denoise_bytes > budget)
    return str_cat("rank ", rank, " denoise: ", format_bytes(e.denoise_bytes), " (weights ", format_bytes(e.weight_bytes),
                   " in ", r.dtype_label, ", activations ", format_bytes(e.activation_bytes), ")", limit,
                   r.world_size == 1 ? "; add ranks, raise the budget" : "; raise the budget", dtype_advice(r),
                   r.microbatch > 1 ? " or lower --microbatch" : "");
  if (e.encode_bytes > budget)
    return str_cat("rank ", rank, " encode: ", format_bytes(e.encode_bytes), " (text encoders ",
                   format_bytes(model.encoder_weight_bytes()), " in ", r.dtype_label, ")", limit, "; raise the budget",
                   dtype_advice(r));
  if (e.image_encode_bytes > budget)
    return str_cat("rank ", rank, " encode images: ", format_bytes(e.image_encode_bytes), " (the VAE encoder on one input)",
                   limit, "; raise the budget, pass --vae-tiling (the encoder tiles too) or use smaller inputs");
  if (e.redux_encode_bytes > budget)
    return str_cat("rank ", rank, " encode redux: ", format_bytes(e.redux_encode_bytes),
                   " (the SigLIP encoder and the Redux embedder)", limit, "; raise the budget", dtype_advice(r));
  if (e.decode_bytes > budget)
    return str_cat("rank ", rank, " decode: ", format_bytes(e.decode_bytes), " (VAE activations ",
                   format_bytes(model.vae_activation_bytes()), r.vae_tiling ? ", tiled" : "", ")", limit, "; ",
                   decode_advice(r, model));
  return "";
}

void throw_infeasible(const PlanRequest& r, const CostModel& model) {
  const int P = r.world_size;
  for (const auto& [rank, budget] : r.max_memory) {
    // The lightest block this rank could hold: a single block when its window of positions
    // (every other rank needs one block too) reaches one.
    const int64_t block = std::min(std::max<int64_t>(rank, model.num_double()), model.num_blocks() - P + rank);
    const StageEstimate e = P == 1 ? model.estimate(0, 0, model.num_blocks() - 1) : model.estimate(rank, block, block);
    const std::string over = stage_over_budget(r, model, rank, e, budget, P == 1 ? "" : " even with a single block");
    if (!over.empty()) throw UsageError(str_cat("--max-memory: ", over));
  }
  const uint64_t weights = model.total_weight_bytes();
  const std::string what = P == 1 ? str_cat("the ", model.num_blocks(), " transformer blocks do not fit the budget on 1 rank")
                                  : str_cat("no split of the ", model.num_blocks(), " transformer blocks over ", P,
                                            " ranks fits the budgets");
  std::string advice = "raise the budgets, add ranks";
  if (!r.vae_tiling && model.tiling_applies()) advice += ", use --vae-tiling";
  throw UsageError(str_cat("--max-memory: ", what, " (", budgets_text(r.max_memory), "): the transformer's weights are ",
                           format_bytes(weights), r.stored ? " as stored" : " in " + r.dtype_label, " and every rank also needs about ",
                           format_bytes(kRuntimeBaselineBytes + model.activation_bytes()), " for runtime and activations; ",
                           advice, r.dtype_bytes > 2 ? " or use --dtype bf16" : ""));
}

}  // namespace fluxmpi::parallel::detail
