#include "parallel/cost_model.h"

#include <algorithm>
#include <cmath>

#include "models/common/quantized_linear.h"
#include "parallel/param_formulas.h"
#include "parallel/runtime_baseline.h"

namespace fluxmpi::parallel::detail {

CostModel::CostModel(const PlanRequest& r)
    : r_(r), p_(r.family ? r.family->params : count_transformer_params(r.transformer)), controlnet_(r) {
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
  total_flops_ = embedder_flops_ + final_flops_ + c.num_layers * double_flops_ + c.num_single_layers * single_flops_ +
                 controlnet_.step_flops();

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

StageEstimate CostModel::estimate(int rank, int64_t first, int64_t last) const {
  StageEstimate e;
  const int64_t doubles = std::max<int64_t>(0, std::min(last, num_double() - 1) - first + 1);
  const int64_t singles = (last - first + 1) - doubles;
  int64_t params = doubles * p_.double_block + singles * p_.single_block;
  e.step_flops = doubles * double_flops_ + singles * single_flops_;
  if (rank == 0) {
    params += p_.embedders;
    e.step_flops += embedder_flops_ + controlnet_.step_flops();
    e.controlnet_weight_bytes = controlnet_.weight_bytes();
  }
  if (rank == r_.world_size - 1) {
    params += p_.final_layer;
    e.step_flops += final_flops_;
  }
  e.weight_bytes = to_bytes(params, r_.dtype_bytes);
  if (r_.stored) {
    e.weight_bytes = 0;
    for (int64_t b = first; b <= last; ++b) e.weight_bytes += block_weight_bytes(b);
    if (rank == 0) e.weight_bytes += r_.stored->embedders.bytes(r_.dtype_bytes);
    if (rank == r_.world_size - 1) e.weight_bytes += r_.stored->final_layer.bytes(r_.dtype_bytes);
  }
  e.flops_share = e.step_flops / total_flops_;
  e.activation_bytes = activation_bytes_;
  // Rank 0 keeps its slice while it decodes: later images are still in the pipeline then.
  const uint64_t resident = (rank == 0 ? kRuntimeBaselineBytes : kWorkerRuntimeBaselineBytes) + e.weight_bytes +
                            (rank == 0 && r_.keep_encoders ? encoder_weight_bytes_ : 0);
  e.kv_cache_bytes = static_cast<uint64_t>(last - first + 1) * r_.kv_cache_block_bytes;
  e.residual_bytes = controlnet_.denoise_bytes(rank, first, last);
  // The ControlNets are freed with the slice, before the decode.
  e.denoise_bytes = resident + e.controlnet_weight_bytes + activation_bytes_ + e.kv_cache_bytes + e.residual_bytes;
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
  if (rank == 0 && r_.redux_encode_bytes > 0) {
    // After the text encoders, before the blocks: SigLIP and the Redux embedder alone.
    e.redux_encode_bytes = kRuntimeBaselineBytes + r_.redux_encode_bytes + job_bytes_;
    if (e.redux_encode_bytes > e.peak_bytes) {
      e.peak_bytes = e.redux_encode_bytes;
      e.peak_stage = "encode redux";
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

uint64_t CostModel::transformer_activations() const {
  const io::TransformerConfig& c = r_.transformer;
  const int64_t m = r_.microbatch, b = r_.dtype_bytes, D = c.inner_dim();
  const int64_t L = r_.image_tokens + r_.text_tokens;
  const int64_t streams = (kStreamTensors + kMessageTensors) * m * L * D * b;
  const int64_t mlp = kMlpTensors * m * L * mlp_hidden_ * b;
  const uint64_t scores = kScoreTensors * score_chunk_bytes(m * c.num_attention_heads, L, L, b, r_.attention_chunk_bytes);
  const int64_t rope = 2 * L * c.attention_head_dim * 4;  // cos and sin tables, fp32
  // Quantized weights: the working memory of the dequantization of one layer's weight per call.
  const uint64_t dequantize = r_.stored ? nn::quantized_scratch_bytes(m * L, D, b) : 0;
  return static_cast<uint64_t>(streams + mlp + rope) + scores + dequantize;
}

uint64_t CostModel::text_activations() const {
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

uint64_t CostModel::job_buffers() const {
  const io::TransformerConfig& c = r_.transformer;
  const int64_t text = r_.passes * (r_.text_tokens * c.joint_attention_dim + c.pooled_projection_dim);
  const int64_t latents = r_.image_tokens * c.in_channels;
  return static_cast<uint64_t>(2 * r_.images * (text + latents) * r_.dtype_bytes);
}

VaeDecodeShape CostModel::decode_shape() const {
  VaeDecodeShape d;
  d.vae = *r_.vae;
  latent_size(&d.latent_height, &d.latent_width);
  d.batch = r_.vae_slicing ? 1 : r_.microbatch;
  d.dtype_bytes = r_.dtype_bytes;
  d.attention_chunk_bytes = r_.attention_chunk_bytes;
  return d;
}

void CostModel::latent_size(int64_t* h, int64_t* w) const {
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

bool CostModel::tiling_applies() const {
  if (!r_.vae) return false;
  int64_t h = 0, w = 0;
  latent_size(&h, &w);
  return vae_tiles(*r_.vae).applies(h, w);
}

int64_t CostModel::tile_count() const {
  int64_t h = 0, w = 0;
  latent_size(&h, &w);
  return vae_tiles(*r_.vae).count(h, w);
}

}  // namespace fluxmpi::parallel::detail
