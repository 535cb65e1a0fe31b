#include "parallel/partition.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/units.h"
#include "parallel/best_split.h"
#include "parallel/cost_model.h"
#include "parallel/decode_plan.h"
#include "parallel/plan_advice.h"
#include "parallel/plan_text.h"

namespace fluxmpi::parallel {

using detail::best_split;
using detail::CostModel;
using detail::parse_index;
using detail::range_text;
using detail::throw_infeasible;
using detail::to_bytes;

namespace {

// 11901408320 -> "11,901,408,320"
std::string group_digits(int64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

StageBlocks stage_blocks(int64_t first, int64_t last, int64_t num_double) {
  StageBlocks s;
  s.first = first;
  s.last = last;
  s.num_double = std::max<int64_t>(0, std::min(last, num_double - 1) - first + 1);
  s.first_double = s.num_double > 0 ? first : 0;
  s.num_single = (last - first + 1) - s.num_double;
  s.first_single = s.num_single > 0 ? std::max(first, num_double) - num_double : 0;
  return s;
}

}  // namespace

const char* balance_name(Balance balance) { return balance == Balance::Compute ? "compute" : "memory"; }

std::string StageBlocks::describe() const {
  std::string s;
  if (num_double > 0) s = str_cat("double ", range_text(first_double, first_double + num_double - 1));
  if (num_single > 0)
    s += str_cat(s.empty() ? "" : ", ", "single ", range_text(first_single, first_single + num_single - 1));
  return s;
}

StagePlan StagePlan::make(const PlanRequest& request) {
  PlanRequest r = request;
  FLUX_CHECK(r.dtype_bytes > 0 && r.image_tokens > 0 && r.text_tokens > 0 && r.microbatch > 0 && r.images > 0 &&
                 r.passes > 0,
             "plan request with non-positive sizes");
  FLUX_CHECK(!r.stored || (static_cast<int64_t>(r.stored->double_blocks.size()) == r.transformer.num_layers &&
                           static_cast<int64_t>(r.stored->single_blocks.size()) == r.transformer.num_single_layers),
             "stored weights of ", r.stored ? r.stored->double_blocks.size() : 0, " + ",
             r.stored ? r.stored->single_blocks.size() : 0, " blocks for a transformer of ", r.transformer.num_layers, " + ",
             r.transformer.num_single_layers);
  const bool applies = CostModel(r).tiling_applies();
  // Tiling a latent no larger than one tile changes nothing: the plan reports it off.
  r.vae_tiling = r.vae_tiling && applies;
  if (r.vae_tiling || !r.auto_vae_tiling || !applies || r.max_memory.empty()) return plan_fixed(r, false);
  std::optional<StagePlan> untiled;
  try {
    untiled = plan_fixed(r, false);
  } catch (const UsageError&) {
    // Nothing fits untiled: tiled, or the reason why not even that fits.
    r.vae_tiling = true;
    return plan_fixed(r, true);
  }
  // The budget lets the untiled decode stage cost balance (rank 0 must take fewer blocks, or
  // the peaks are less even): tiling, if the tiled plan is better by what the balance ranks first.
  PlanRequest tiled_request = r;
  tiled_request.vae_tiling = true;
  StagePlan tiled = plan_fixed(tiled_request, true);
  auto primary = [&](const StagePlan& plan) {
    std::vector<int64_t> v;
    for (int rank = 0; rank < plan.world_size(); ++rank)
      v.push_back(r.balance == Balance::Compute ? plan.blocks(rank).count()
                                                : static_cast<int64_t>(plan.estimate(rank).peak_bytes));
    std::sort(v.begin(), v.end(), std::greater<int64_t>());
    return v;
  };
  // Rank 0's slice in the tiled plan, decoded untiled, would break its budget: only tiling makes
  // that plan possible.
  const auto budget0 = r.max_memory.find(0);
  const bool decode_binds =
      budget0 != r.max_memory.end() &&
      CostModel(r).estimate(0, tiled.blocks(0).first, tiled.blocks(0).last).decode_bytes > budget0->second;
  if (decode_binds && primary(tiled) < primary(*untiled)) return tiled;
  return *untiled;
}

StagePlan StagePlan::plan_fixed(const PlanRequest& r, bool auto_tiling) {
  const int64_t B = r.transformer.num_blocks();
  const int P = r.world_size;
  FLUX_CHECK(P >= 1, "world size ", P);
  if (P > B)
    throw UsageError(str_cat("cannot split the transformer's ", B, " blocks over ", P,
                             " ranks: every rank needs at least one block; run with at most ", B, " ranks"));

  CostModel model(r);
  auto budget_of = [&](int rank) {
    auto it = r.max_memory.find(rank);
    return it == r.max_memory.end() ? std::numeric_limits<uint64_t>::max() : it->second;
  };

  std::vector<int64_t> firsts;
  if (!r.partition.empty()) {
    check_partition(r.partition, P, B);
    for (const BlockRange& b : r.partition) firsts.push_back(b.first);
  } else {
    auto feasible = [&](int rank, int64_t first, int64_t last) {
      return model.estimate(rank, first, last).peak_bytes <= budget_of(rank);
    };
    // compute: block counts (the slowest stage sets the pipeline's pace), then peak memory, then
    // FLOPs (rank 0's embedders, the last rank's final layer); memory: peaks, then block counts.
    auto cost = [&](int rank, int64_t first, int64_t last) {
      const StageEstimate e = model.estimate(rank, first, last);
      const int64_t blocks = model.block_load(rank, first, last), peak = static_cast<int64_t>(e.peak_bytes);
      const int64_t flops = std::llround(e.step_flops);
      return r.balance == Balance::Compute ? std::vector<int64_t>{blocks, peak, flops} : std::vector<int64_t>{peak, blocks};
    };
    firsts = best_split(P, B, cost, feasible);
    if (firsts.empty()) throw_infeasible(r, model);
  }

  StagePlan plan;
  plan.params_ = model.params();
  plan.num_double_ = r.transformer.num_layers;
  plan.num_single_ = r.transformer.num_single_layers;
  plan.balance_ = r.balance;
  plan.overridden_ = !r.partition.empty();
  plan.budgets_ = r.max_memory;
  plan.vae_tiling_ = r.vae_tiling;
  plan.vae_tiling_auto_ = auto_tiling;
  for (int rank = 0; rank < P; ++rank) {
    const int64_t first = firsts[rank];
    const int64_t last = rank + 1 < P ? firsts[rank + 1] - 1 : B - 1;
    plan.blocks_.push_back(stage_blocks(first, last, plan.num_double_));
    plan.estimates_.push_back(model.estimate(rank, first, last));
    const StageEstimate& e = plan.estimates_.back();
    if (e.peak_bytes > budget_of(rank))
      throw UsageError(str_cat("--partition gives rank ", rank, " blocks ", range_text(first, last), " (",
                               plan.blocks_.back().describe(), "), estimated peak ", format_bytes(e.peak_bytes), " (",
                               e.peak_stage, "), above its --max-memory budget of ", format_bytes(budget_of(rank))));
  }

  if (r.vae) {
    // Helpers decode once their blocks are freed: the runtime, the decoder and their tiles.
    plan.decode_ = plan_decode(model.decode_shape(), r.vae_tiling, P, kRuntimeBaselineBytes + model.vae_weight_bytes(),
                               r.max_memory);
    for (const auto& [rank, bytes] : plan.decode_.helper_bytes) {
      StageEstimate& e = plan.estimates_[rank];
      e.decode_bytes = bytes;
      if (bytes > e.peak_bytes) {
        e.peak_bytes = bytes;
        e.peak_stage = "decode";
      }
    }
  }

  std::ostringstream s;
  s << "FLUX transformer: " << plan.num_double_ << " double + " << plan.num_single_ << " single blocks, "
    << group_digits(plan.params_.total) << " parameters (";
  if (r.stored)
    s << format_bytes(r.stored->total(r.dtype_bytes)) << " as held: " << r.stored->label << "; quantized tensors kept as stored, the others in "
      << r.dtype_label << ")\n";
  else
    s << format_bytes(to_bytes(plan.params_.total, r.dtype_bytes)) << " in " << r.dtype_label << ")\n";
  s << "plan: " << (plan.overridden_ ? "--partition override" : str_cat("balance ", balance_name(r.balance)))
    << (P == 1 ? " on 1 rank" : str_cat(" over ", P, " ranks")) << "; per step " << r.image_tokens << " image + "
    << r.text_tokens << " text tokens, microbatch " << r.microbatch << "\n";
  plan.header_ = s.str();
  {
    const StageEstimate& e0 = plan.estimates_.front();
    std::string stages = "rank 0 stages: ";
    if (model.encodes())
      stages += str_cat("encode ", format_bytes(e0.encode_bytes), " (text encoders ", format_bytes(model.encoder_weight_bytes()),
                        r.keep_encoders ? ", kept resident" : ", freed before the blocks load", "), ");
    if (r.image_encode_bytes > 0)
      stages += str_cat("encode images ", format_bytes(e0.image_encode_bytes), " (VAE encoder, freed before the blocks load), ");
    if (r.redux_encode_bytes > 0)
      stages += str_cat("encode redux ", format_bytes(e0.redux_encode_bytes),
                        " (SigLIP + Redux embedder, freed before the blocks load), ");
    stages += str_cat("denoise ", format_bytes(e0.denoise_bytes));
    if (r.vae) {
      std::string how;
      if (r.vae_tiling)
        how = str_cat(", tiled: ", model.tile_count(), " tiles", auto_tiling ? ", switched on to fit the budget" : "");
      if (r.vae_slicing && r.microbatch > 1) how += ", sliced";
      if (plan.decode_.spread()) how += str_cat(", spread over ", plan.decode_.ranks.size(), " ranks");
      stages += str_cat(", decode ", format_bytes(e0.decode_bytes), " (VAE decoder ", format_bytes(model.vae_weight_bytes()),
                        " + activations ", format_bytes(model.vae_activation_bytes()), how, ")");
    }
    stages += "\n" + plan.decode_.describe(r.max_memory);
    if (r.images > 0)
      stages += str_cat("rank 0 buffers: ", r.images, " image", r.images == 1 ? "" : "s", " x ",
                        format_bytes(model.job_bytes() / static_cast<uint64_t>(r.images)),
                        " (text embeddings and latents) = ", format_bytes(model.job_bytes()), "; activations per rank ",
                        format_bytes(model.activation_bytes()), " (microbatch ", r.microbatch, ")\n");
    plan.footer_ = stages;
  }
  if (r.controlnet) {
    plan.footer_ += model.controlnet().describe();
    std::string held = "residuals and ControlNet buffers (in the peaks):";
    for (int rank = 0; rank < P; ++rank)
      held += str_cat(rank ? "," : "", " rank ", rank, " ", format_bytes(plan.estimates_[rank].residual_bytes));
    plan.footer_ += held + "\n";
  }
  if (r.kv_cache_block_bytes > 0) {
    std::string kv = str_cat("patch pipelining: key/value buffers ", format_bytes(r.kv_cache_block_bytes),
                             " per block (in the peaks):");
    for (int rank = 0; rank < P; ++rank)
      kv += str_cat(rank ? "," : "", " rank ", rank, " ", format_bytes(plan.estimates_[rank].kv_cache_bytes));
    plan.footer_ += kv + "\n";
  }
  return plan;
}

const StageBlocks& StagePlan::blocks(int rank) const {
  FLUX_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " of ", world_size());
  return blocks_[rank];
}

const StageEstimate& StagePlan::estimate(int rank) const {
  FLUX_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " of ", world_size());
  return estimates_[rank];
}

int StagePlan::rank_of_block(int64_t block) const {
  for (int r = 0; r < world_size(); ++r)
    if (block >= blocks_[r].first && block <= blocks_[r].last) return r;
  throw InternalError(str_cat("block ", block, " is outside the transformer's ", num_blocks(), " blocks"));
}

bool StagePlan::owns_key(int rank, const std::string& key) const {
  auto indexed = [&](const std::string& prefix) -> std::optional<int64_t> {
    if (key.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
    const size_t dot = key.find('.', prefix.size());
    return parse_index(key.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size()));
  };
  auto starts = [&](const char* prefix) { return key.rfind(prefix, 0) == 0; };
  const StageBlocks& b = blocks(rank);
  if (auto i = indexed("transformer_blocks.")) {
    if (*i < num_double_) return b.num_double > 0 && *i >= b.first_double && *i < b.first_double + b.num_double;
  } else if (auto j = indexed("single_transformer_blocks.")) {
    if (*j < num_single_) return b.num_single > 0 && *j >= b.first_single && *j < b.first_single + b.num_single;
  } else if (starts("norm_out.") || starts("proj_out.")) {
    return owns_final_layer(rank);
  }
  // Embedders, block indices beyond the config and keys of no known module: rank 0, whose loader
  // reports whatever its modules do not claim.
  return owns_embedders(rank);
}

std::string StagePlan::table() const {
  std::ostringstream s;
  s << header_;
  std::vector<std::string> descriptions;
  size_t width = 6;
  for (const StageBlocks& b : blocks_) {
    descriptions.push_back(b.describe());
    width = std::max(width, descriptions.back().size());
  }
  char line[512];
  std::snprintf(line, sizeof line, "%4s  %-*s  %10s  %6s  %11s  %-7s  %s\n", "rank", static_cast<int>(width), "blocks",
                "weights", "FLOPs", "peak memory", "stage", "budget");
  s << line;
  for (int r = 0; r < world_size(); ++r) {
    const StageEstimate& e = estimates_[r];
    auto it = budgets_.find(r);
    const std::string budget = it == budgets_.end() ? "-" : format_bytes(it->second);
    char share[32];
    std::snprintf(share, sizeof share, "%.1f%%", 100.0 * e.flops_share);
    std::snprintf(line, sizeof line, "%4d  %-*s  %10s  %6s  %11s  %-7s  %s\n", r, static_cast<int>(width),
                  descriptions[r].c_str(), format_bytes(e.weight_bytes).c_str(), share, format_bytes(e.peak_bytes).c_str(),
                  e.peak_stage, budget.c_str());
    s << line;
  }
  s << footer_;
  return s.str();
}

}  // namespace fluxmpi::parallel