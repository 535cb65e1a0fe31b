#include "parallel/controlnet_costs.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"
#include "parallel/cost_model.h"
#include "parallel/param_formulas.h"

namespace fluxmpi::parallel {

int64_t count_controlnet_params(const io::ControlNetConfig& c) {
  // The blocks are the transformer's, of the ControlNet's own width; then per block its output
  // linear, the embedders, controlnet_x_embedder, the mode embedding, input_hint_block.
  io::TransformerConfig t;
  t.in_channels = c.in_channels;
  t.out_channels = c.in_channels;
  t.num_layers = c.num_layers;
  t.num_single_layers = c.num_single_layers;
  t.attention_head_dim = c.attention_head_dim;
  t.num_attention_heads = c.num_attention_heads;
  t.joint_attention_dim = c.joint_attention_dim;
  t.pooled_projection_dim = c.pooled_projection_dim;
  t.guidance_embeds = c.guidance_embeds;
  const TransformerParamCounts p = count_transformer_params(t);
  const int64_t D = c.inner_dim();
  int64_t n = p.total - p.final_layer + c.num_blocks() * detail::linear(D, D) + detail::linear(c.in_channels, D);
  if (c.num_mode) n += *c.num_mode * D;
  if (c.conditioning_embedding_channels) {
    const int64_t h = io::kHintChannels;
    n += detail::conv(3, h, 3) + 6 * detail::conv(h, h, 3) + detail::conv(h, *c.conditioning_embedding_channels, 3);
  }
  return n;
}

namespace detail {

ControlNetCosts::ControlNetCosts(const PlanRequest& r) : r_(r) {
  if (!r.controlnet) return;
  const ControlNetRequest& cn = *r.controlnet;
  for (const io::ControlNetConfig& c : cn.nets) weight_bytes_ += to_bytes(count_controlnet_params(c), r.dtype_bytes);
  const double m = static_cast<double>(r.microbatch);
  for (size_t net : cn.runs) {
    FLUX_CHECK(net < cn.nets.size(), "ControlNet run of net ", net, " of ", cn.nets.size());
    const io::ControlNetConfig& c = cn.nets[net];
    const double D = static_cast<double>(c.inner_dim());
    const double L = static_cast<double>(r.image_tokens + c.text_tokens(r.text_tokens));
    // As the cost model's blocks (cost_model.cpp), plus the output linear on the image tokens.
    const double per_token = 2.0 * (4 * D * D + 2 * D * kMlpRatio * D) * L + 4.0 * L * L * D;
    const double out = 2.0 * D * D * static_cast<double>(r.image_tokens);
    step_flops_ += m * (c.num_layers * (per_token + 2.0 * 2 * D * 6 * D + out) +
                        c.num_single_layers * (per_token + 2.0 * D * 3 * D + out) +
                        2.0 * c.in_channels * D * r.image_tokens + 2.0 * c.joint_attention_dim * D * r.text_tokens);
    block_runs_ += c.num_blocks();
    largest_run_ = std::max(largest_run_, c.num_blocks());
  }
}

uint64_t ControlNetCosts::sample_bytes() const {
  return to_bytes(r_.microbatch * r_.image_tokens * r_.transformer.inner_dim(), r_.dtype_bytes);
}

uint64_t ControlNetCosts::denoise_bytes(int rank, int64_t first, int64_t last) const {
  if (!r_.controlnet) return 0;
  const ControlNetRequest& cn = *r_.controlnet;
  const io::TransformerConfig& t = r_.transformer;
  if (rank > 0) return static_cast<uint64_t>(cn.layout.samples_of_blocks(first, last, t).size()) * sample_bytes();
  const int64_t B = t.num_blocks();
  const uint64_t others = last + 1 < B ? cn.layout.samples_of_blocks(last + 1, B - 1, t).size() : 0;
  const int64_t groups = (r_.images + r_.microbatch - 1) / r_.microbatch;
  const uint64_t backlog = static_cast<uint64_t>(std::min<int64_t>(groups, r_.world_size - 1));
  uint64_t bytes = (static_cast<uint64_t>(cn.layout.samples() + largest_run_) + others * backlog) * sample_bytes();
  // Every image's embedded control image per run, [L, D], for the whole job.
  bytes += to_bytes(r_.images * static_cast<int64_t>(cn.runs.size()) * r_.image_tokens * t.inner_dim(), r_.dtype_bytes);
  // Patches: each run's blocks keep key/value buffers (one pass: the ControlNet runs once a step).
  if (r_.kv_cache_block_bytes > 0) bytes += static_cast<uint64_t>(block_runs_) * r_.kv_cache_block_bytes / r_.passes;
  return bytes;
}

std::string ControlNetCosts::describe() const {
  if (!r_.controlnet) return "";
  const ControlNetRequest& cn = *r_.controlnet;
  return str_cat("ControlNets: ", cn.nets.size(), " net", cn.nets.size() == 1 ? "" : "s", " (", format_bytes(weight_bytes_),
                 " on rank 0), ", cn.runs.size(), " run", cn.runs.size() == 1 ? "" : "s", " a step (", block_runs_,
                 " blocks on rank 0); residual samples: ", cn.layout.double_samples, " double + ",
                 cn.layout.single_samples, " single, ", format_bytes(sample_bytes()), " each per unit\n");
}

}  // namespace detail
}  // namespace fluxmpi::parallel
