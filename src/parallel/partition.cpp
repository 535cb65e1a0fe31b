#include "parallel/partition.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/units.h"
#include "parallel/decode_plan.h"
#include "parallel/param_formulas.h"
#include "parallel/plan_text.h"

namespace fluxmpi::parallel {

using detail::affine_norm;
using detail::conv;
using detail::kMlpRatio;
using detail::linear;
using detail::llm_text_activation_bytes;
using detail::parse_index;
using detail::range_text;
using detail::score_chunk_bytes;

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

uint64_t to_bytes(int64_t elements, int64_t dtype_bytes) { return static_cast<uint64_t>(elements * dtype_bytes); }

// Everything the estimates of one plan need, computed once from the request.
class CostModel {
 public:
  explicit CostModel(const PlanRequest& r)
      : r_(r), p_(r.family ? r.family->params : count_transformer_params(r.transformer)) {
    const io::TransformerConfig& c = r.transformer;
    const int64_t D = c.inner_dim();
    const double m = static_cast<double>(r.microbatch);
    const double L = static_cast<double>(r.image_tokens + r.text_tokens);
    const double Dd = static_cast<double>(D);
    mlp_hidden_ = r.family ? r.family->mlp_hidden : kMlpRatio * D;
    const bool block_modulation = !r.family || r.family->block_modulation;
    // Each token meets 4 D^2 attention weights (q, k, v, out) and the MLP's matrices in either
    // block type (double: those of its own stream; single: the fused projections over [attn,
    // mlp]): 12 D^2 for FLUX.1's GELU MLP of 4D; attention is QK^T and AV over the joint sequence;
    // FLUX.1's modulation linears act on temb once per image and block.
    const double mlp = static_cast<double>(r.family ? r.family->mlp_matrices : 2) * Dd * static_cast<double>(mlp_hidden_);
    const double per_token = 2.0 * (4 * Dd * Dd + mlp) * L + 4.0 * L * L * Dd;
    double_flops_ = m * (per_token + (block_modulation ? 2.0 * 2 * Dd * 6 * Dd : 0.0));
    single_flops_ = m * (per_token + (block_modulation ? 2.0 * Dd * 3 * Dd : 0.0));
    const double time_text = static_cast<double>(p_.embedders - linear(c.in_channels, D) - linear(c.joint_attention_dim, D));
    embedder_flops_ = m * (2.0 * c.in_channels * Dd * r.image_tokens + 2.0 * c.joint_attention_dim * Dd * r.text_tokens +
                           2.0 * time_text);
    final_flops_ = m * (2.0 * Dd * 2 * Dd + 2.0 * Dd * c.out_channels * r.image_tokens);
    total_flops_ = embedder_flops_ + final_flops_ + c.num_layers * double_flops_ + c.num_single_layers * single_flops_;

    activation_bytes_ = transformer_activations();
    if (r.clip) encoder_weight_bytes_ += to_bytes(count_clip_text_params(*r.clip), r.dtype_bytes);
    if (r.t5) encoder_weight_bytes_ += to_bytes(count_t5_encoder_params(*r.t5), r.dtype_bytes);
    if (r.llm) encoder_weight_bytes_ += to_bytes(r.llm->shape.params(r.llm->layers, r.llm->final_norm), r.dtype_bytes);
    encoder_activation_bytes_ = text_activations();
    if (r.vae) {
      vae_weight_bytes_ = to_bytes(count_vae_decoder_params(*r.vae), r.dtype_bytes);
      vae_activation_bytes_ = vae_decode_activation_bytes(decode_shape(), r.vae_tiling);
    }
    job_bytes_ = job_buffers();
  }

  const TransformerParamCounts& params() const { return p_; }
  int64_t num_double() const { return r_.transformer.num_layers; }
  int64_t num_blocks() const { return r_.transformer.num_blocks(); }
  bool is_double(int64_t block) const { return block < num_double(); }
  uint64_t block_weight_bytes(int64_t block) const {
    return to_bytes(is_double(block) ? p_.double_block : p_.single_block, r_.dtype_bytes);
  }
  uint64_t encoder_weight_bytes() const { return encoder_weight_bytes_; }
  uint64_t vae_weight_bytes() const { return vae_weight_bytes_; }
  uint64_t vae_activation_bytes() const { return vae_activation_bytes_; }
  uint64_t activation_bytes() const { return activation_bytes_; }
  uint64_t job_bytes() const { return job_bytes_; }
  bool encodes() const { return r_.clip || r_.t5 || r_.llm; }

  // The estimate of `rank` running global blocks first..last.
  StageEstimate estimate(int rank, int64_t first, int64_t last) const {
    StageEstimate e;
    const int64_t doubles = std::max<int64_t>(0, std::min(last, num_double() - 1) - first + 1);
    const int64_t singles = (last - first + 1) - doubles;
    int64_t params = doubles * p_.double_block + singles * p_.single_block;
    e.step_flops = doubles * double_flops_ + singles * single_flops_;
    if (rank == 0) {
      params += p_.embedders;
      e.step_flops += embedder_flops_;
    }
    if (rank == r_.world_size - 1) {
      params += p_.final_layer;
      e.step_flops += final_flops_;
    }
    e.weight_bytes = to_bytes(params, r_.dtype_bytes);
    e.flops_share = e.step_flops / total_flops_;
    e.activation_bytes = activation_bytes_;
    // Rank 0 keeps its slice while it decodes: later images are still in the pipeline then.
    const uint64_t resident =
        kRuntimeBaselineBytes + e.weight_bytes + (rank == 0 && r_.keep_encoders ? encoder_weight_bytes_ : 0);
    e.kv_cache_bytes = static_cast<uint64_t>(last - first + 1) * r_.kv_cache_block_bytes;
    e.denoise_bytes = resident + activation_bytes_ + e.kv_cache_bytes;
    e.peak_bytes = e.denoise_bytes;
    if (rank == 0) {
      e.job_bytes = job_bytes_;
      e.denoise_bytes += job_bytes_;
      e.peak_bytes = e.denoise_bytes;
    }
    if (rank == 0 && encodes()) {
      e.encode_bytes = kRuntimeBaselineBytes + encoder_weight_bytes_ + encoder_activation_bytes_ + job_bytes_;
      if (e.encode_bytes > e.peak_bytes) {
        e.peak_bytes = e.encode_bytes;
        e.peak_stage = "encode";
      }
    }
    if (rank == 0 && r_.image_encode_bytes > 0) {
      // Between the text encoders and the blocks: the VAE encoder alone, with the job's buffers.
      e.image_encode_bytes = kRuntimeBaselineBytes + r_.image_encode_bytes + job_bytes_;
      if (e.image_encode_bytes > e.peak_bytes) {
        e.peak_bytes = e.image_encode_bytes;
        e.peak_stage = "encode images";
      }
    }
    if (rank == 0 && r_.vae) {
      e.decode_bytes = resident + job_bytes_ + vae_weight_bytes_ + vae_activation_bytes_;
      if (e.decode_bytes > e.peak_bytes) {
        e.peak_bytes = e.decode_bytes;
        e.peak_stage = "decode";
      }
    }
    return e;
  }

 private:
  uint64_t transformer_activations() const {
    const io::TransformerConfig& c = r_.transformer;
    const int64_t m = r_.microbatch, b = r_.dtype_bytes, D = c.inner_dim();
    const int64_t L = r_.image_tokens + r_.text_tokens;
    const int64_t streams = (kStreamTensors + kMessageTensors) * m * L * D * b;
    const int64_t mlp = kMlpTensors * m * L * mlp_hidden_ * b;
    const uint64_t scores = kScoreTensors * score_chunk_bytes(m * c.num_attention_heads, L, L, b, r_.attention_chunk_bytes);
    const int64_t rope = 2 * L * c.attention_head_dim * 4;  // cos and sin tables, fp32
    return static_cast<uint64_t>(streams + mlp + rope) + scores;
  }

  // Encoders run one after the other on one prompt at a time: the larger working set counts.
  uint64_t text_activations() const {
    const int64_t b = r_.dtype_bytes;
    uint64_t clip = 0, t5 = 0;
    if (r_.clip) {
      const io::ClipTextConfig& c = *r_.clip;
      const int64_t S = c.max_position_embeddings;
      clip = static_cast<uint64_t>(kTextStreamTensors * S * c.hidden_size * b + 2 * S * c.intermediate_size * b) +
             kScoreTensors * score_chunk_bytes(c.num_attention_heads, S, S, b, r_.attention_chunk_bytes);
    }
    if (r_.t5) {
      const io::T5Config& c = *r_.t5;
      const int64_t S = r_.text_tokens;
      const int64_t width = std::max(c.d_model, c.num_heads * c.d_kv);
      const int64_t ff_tensors = c.gated ? 3 : 2;
      // The relative position bias [H, S, S] is computed once and kept for every layer.
      t5 = static_cast<uint64_t>(kTextStreamTensors * S * width * b + ff_tensors * S * c.d_ff * b +
                                 c.num_heads * S * S * b) +
           kScoreTensors * score_chunk_bytes(c.num_heads, S, S, b, r_.attention_chunk_bytes);
    }
    const uint64_t llm = r_.llm ? llm_text_activation_bytes(r_.llm->shape, r_.text_tokens, b, r_.attention_chunk_bytes) : 0;
    return std::max({clip, t5, llm});
  }

  // Rank 0 keeps every image's text embeddings (also gathered per microbatch group, so twice)
  // and its latents (the image's own and its group's) for the whole job.
  uint64_t job_buffers() const {
    const io::TransformerConfig& c = r_.transformer;
    const int64_t text = r_.passes * (r_.text_tokens * c.joint_attention_dim + c.pooled_projection_dim);
    const int64_t latents = r_.image_tokens * c.in_channels;
    return static_cast<uint64_t>(2 * r_.images * (text + latents) * r_.dtype_bytes);
  }

 public:
  VaeDecodeShape decode_shape() const {
    VaeDecodeShape d;
    d.vae = *r_.vae;
    latent_size(&d.latent_height, &d.latent_width);
    d.batch = r_.vae_slicing ? 1 : r_.microbatch;
    d.dtype_bytes = r_.dtype_bytes;
    d.attention_chunk_bytes = r_.attention_chunk_bytes;
    return d;
  }

  void latent_size(int64_t* h, int64_t* w) const {
    if (r_.latent_height > 0 && r_.latent_width > 0) {
      *h = r_.latent_height;
      *w = r_.latent_width;
      return;
    }
    // A square of 2x2 latent cells per packed token.
    int64_t side = static_cast<int64_t>(std::llround(std::sqrt(4.0 * static_cast<double>(r_.image_tokens))));
    *h = side;
    *w = (4 * r_.image_tokens) / std::max<int64_t>(side, 1);
  }
  bool tiling_applies() const {
    if (!r_.vae) return false;
    int64_t h = 0, w = 0;
    latent_size(&h, &w);
    return vae_tiles(*r_.vae).applies(h, w);
  }
  int64_t tile_count() const {
    int64_t h = 0, w = 0;
    latent_size(&h, &w);
    return vae_tiles(*r_.vae).count(h, w);
  }

 private:
  const PlanRequest& r_;
  TransformerParamCounts p_;
  int64_t mlp_hidden_ = 0;
  double double_flops_ = 0, single_flops_ = 0, embedder_flops_ = 0, final_flops_ = 0, total_flops_ = 0;
  uint64_t activation_bytes_ = 0;
  uint64_t encoder_weight_bytes_ = 0, encoder_activation_bytes_ = 0;
  uint64_t vae_weight_bytes_ = 0, vae_activation_bytes_ = 0;
  uint64_t job_bytes_ = 0;
};

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

// A split's cost, compared lexicographically: for each level in turn, the per-rank values sorted
// from the largest down (the largest peak, then the next largest, ...). Adding the same slice to
// two partial splits keeps their order, so the best split of the first r ranks over the first j
// blocks extends to the best split of all: a dynamic programme over (ranks used, blocks covered).
using SplitKey = std::vector<std::vector<int64_t>>;

SplitKey extended(const SplitKey& key, const std::vector<int64_t>& slice) {
  SplitKey out = key;
  out.resize(slice.size());
  for (size_t level = 0; level < slice.size(); ++level) {
    auto& values = out[level];
    values.insert(std::upper_bound(values.begin(), values.end(), slice[level], std::greater<int64_t>()), slice[level]);
  }
  return out;
}

// Contiguous split of B blocks into P non-empty slices with the lexicographically smallest
// SplitKey of `cost(rank, first, last)` (one value per level), slices that break a budget
// excluded. O(P B^2) slice costs. Ties go to the earliest cut. Returns the first block of each
// rank, or an empty vector when nothing fits.
template <typename Cost, typename Feasible>
std::vector<int64_t> best_split(int P, int64_t B, Cost cost, Feasible feasible) {
  std::vector<std::vector<std::optional<SplitKey>>> best(P + 1, std::vector<std::optional<SplitKey>>(B + 1));
  std::vector<std::vector<int64_t>> choice(P + 1, std::vector<int64_t>(B + 1, -1));
  best[0][0] = SplitKey{};
  for (int r = 1; r <= P; ++r) {
    // Rank r-1 takes blocks [i, j); the ranks before it need one block each, the ranks after it
    // one block each too.
    for (int64_t j = r; j <= B - (P - r); ++j) {
      for (int64_t i = r - 1; i < j; ++i) {
        if (!best[r - 1][i] || !feasible(r - 1, i, j - 1)) continue;
        SplitKey key = extended(*best[r - 1][i], cost(r - 1, i, j - 1));
        if (!best[r][j] || key < *best[r][j]) {
          best[r][j] = std::move(key);
          choice[r][j] = i;
        }
      }
    }
  }
  if (!best[P][B]) return {};
  std::vector<int64_t> firsts(P);
  int64_t j = B;
  for (int r = P; r >= 1; --r) {
    firsts[r - 1] = choice[r][j];
    j = choice[r][j];
  }
  return firsts;
}

std::string budgets_text(const std::map<int, uint64_t>& budgets) {
  std::string s;
  for (const auto& [rank, bytes] : budgets) s += str_cat(s.empty() ? "" : ", ", rank, "=", format_bytes(bytes));
  return s;
}

// " or use a smaller --dtype" where there is a smaller one to use.
std::string dtype_advice(const PlanRequest& r) { return r.dtype_bytes > 2 ? " or use --dtype bf16" : ""; }

// What would make the decode stage smaller.
std::string decode_advice(const PlanRequest& r, const CostModel& model) {
  std::string s;
  if (!r.vae_tiling && model.tiling_applies()) s += "use --vae-tiling, ";
  if (!r.vae_slicing && r.microbatch > 1) s += "use --vae-slicing, ";
  return s + "raise the budget" + dtype_advice(r) + " or make smaller images";
}

// The stage of `e` (on `rank`) that exceeds `budget`, as "rank 0 decode: 25.5 GiB (VAE
// activations 3.0 GiB) > 24.0 GiB; <advice>", or "" when none does.
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
  if (e.decode_bytes > budget)
    return str_cat("rank ", rank, " decode: ", format_bytes(e.decode_bytes), " (VAE activations ",
                   format_bytes(model.vae_activation_bytes()), r.vae_tiling ? ", tiled" : "", ")", limit, "; ",
                   decode_advice(r, model));
  return "";
}

// The clearest reason why no split fits: a rank whose fixed load (plus its lightest possible
// slice: one block, or every block on 1 rank) already exceeds its budget, else the total.
[[noreturn]] void throw_infeasible(const PlanRequest& r, const CostModel& model) {
  const int P = r.world_size;
  for (const auto& [rank, budget] : r.max_memory) {
    // The lightest block this rank could hold: a single block when its window of positions
    // (every other rank needs one block too) reaches one.
    const int64_t block = std::min(std::max<int64_t>(rank, model.num_double()), model.num_blocks() - P + rank);
    const StageEstimate e = P == 1 ? model.estimate(0, 0, model.num_blocks() - 1) : model.estimate(rank, block, block);
    const std::string over = stage_over_budget(r, model, rank, e, budget, P == 1 ? "" : " even with a single block");
    if (!over.empty()) throw UsageError(str_cat("--max-memory: ", over));
  }
  const uint64_t weights = to_bytes(model.params().total, r.dtype_bytes);
  const std::string what = P == 1 ? str_cat("the ", model.num_blocks(), " transformer blocks do not fit the budget on 1 rank")
                                  : str_cat("no split of the ", model.num_blocks(), " transformer blocks over ", P,
                                            " ranks fits the budgets");
  std::string advice = "raise the budgets, add ranks";
  if (!r.vae_tiling && model.tiling_applies()) advice += ", use --vae-tiling";
  throw UsageError(str_cat("--max-memory: ", what, " (", budgets_text(r.max_memory), "): the transformer's weights are ",
                           format_bytes(weights), " in ", r.dtype_label, " and every rank also needs about ",
                           format_bytes(kRuntimeBaselineBytes + model.activation_bytes()), " for runtime and activations; ",
                           advice, r.dtype_bytes > 2 ? " or use --dtype bf16" : ""));
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
      const int64_t blocks = last - first + 1, peak = static_cast<int64_t>(e.peak_bytes);
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
    << group_digits(plan.params_.total) << " parameters (" << format_bytes(to_bytes(plan.params_.total, r.dtype_bytes))
    << " in " << r.dtype_label << ")\n";
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
