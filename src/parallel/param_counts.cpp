#include "io/flux2_configs.h"
#include "parallel/param_formulas.h"
#include "parallel/partition.h"

#include <vector>

namespace fluxmpi::parallel {

using detail::affine_norm;
using detail::conv;
using detail::kMlpRatio;
using detail::kTimestepChannels;
using detail::linear;
using detail::vae_resnet;

TransformerParamCounts count_transformer_params(const io::TransformerConfig& c) {
  const int64_t D = c.inner_dim(), Dh = c.attention_head_dim, F = kMlpRatio * D;
  TransformerParamCounts p;
  // FluxTransformerBlock: per stream (img, txt) an AdaLayerNormZero (6 modulation vectors), q/k/v
  // and output projections, a per-head RMSNorm weight on q and on k, and a GELU MLP D -> 4D -> D.
  p.double_block = 2 * (linear(D, 6 * D) + 4 * linear(D, D) + 2 * Dh + linear(D, F) + linear(F, D));
  // FluxSingleTransformerBlock: AdaLayerNormZeroSingle (3 vectors), q/k/v with RMSNorm weights,
  // proj_mlp D -> 4D and proj_out over the concatenation [attention, mlp].
  p.single_block = linear(D, 3 * D) + 3 * linear(D, D) + 2 * Dh + linear(D, F) + linear(D + F, D);
  const int64_t timestep_mlp = linear(kTimestepChannels, D) + linear(D, D);
  p.embedders = linear(c.in_channels, D) + linear(c.joint_attention_dim, D) +
                timestep_mlp * (c.guidance_embeds ? 2 : 1) + linear(c.pooled_projection_dim, D) + linear(D, D);
  p.final_layer = linear(D, 2 * D) + linear(D, c.patch_size * c.patch_size * c.out_channels);
  p.total = p.embedders + c.num_layers * p.double_block + c.num_single_layers * p.single_block + p.final_layer;
  return p;
}

int64_t count_clip_text_params(const io::ClipTextConfig& c) {
  const int64_t H = c.hidden_size;
  const int64_t layer = 4 * linear(H, H) + 2 * affine_norm(H) + linear(H, c.intermediate_size) + linear(c.intermediate_size, H);
  return c.vocab_size * H + c.max_position_embeddings * H + c.num_hidden_layers * layer + affine_norm(H);
}

int64_t count_t5_encoder_params(const io::T5Config& c) {
  const int64_t d = c.d_model, inner = c.num_heads * c.d_kv;
  const int64_t ff = (c.gated ? 2 : 1) * d * c.d_ff + c.d_ff * d;
  const int64_t layer = 3 * d * inner + inner * d + d + ff + d;  // T5 linears and RMSNorms have no bias
  return c.vocab_size * d + c.num_layers * layer + c.relative_attention_num_buckets * c.num_heads + d;
}

int64_t count_vae_decoder_params(const io::VaeConfig& v) {
  std::vector<int64_t> channels(v.block_out_channels.rbegin(), v.block_out_channels.rend());
  const int64_t top = channels.front();
  int64_t n = v.use_post_quant_conv ? conv(v.latent_channels, v.latent_channels, 1) : 0;
  n += conv(v.latent_channels, top, 3);
  n += 2 * vae_resnet(top, top);
  if (v.mid_block_add_attention) n += affine_norm(top) + 4 * linear(top, top);
  int64_t in = top;
  for (size_t i = 0; i < channels.size(); ++i) {
    const int64_t out = channels[i];
    for (int64_t j = 0; j < v.layers_per_block + 1; ++j) n += vae_resnet(j == 0 ? in : out, out);
    if (i + 1 < channels.size()) n += conv(out, out, 3);  // upsamplers.0.conv
    in = out;
  }
  n += affine_norm(v.block_out_channels.front()) + conv(v.block_out_channels.front(), v.out_channels, 3);
  return n;
}

FamilyCosts flux2_family_costs(const io::Flux2TransformerConfig& c) {
  // No biases anywhere: a projection is in x out weights.
  auto matrix = [](int64_t in, int64_t out) { return in * out; };
  const int64_t D = c.inner_dim(), Dh = c.attention_head_dim, F = c.mlp_hidden_dim();
  FamilyCosts f;
  f.mlp_hidden = F;
  f.mlp_matrices = 3;  // SwiGLU: linear_in D -> 2F (gate and value), linear_out F -> D
  f.block_modulation = false;
  TransformerParamCounts& p = f.params;
  // Flux2TransformerBlock: per stream q/k/v/out, a per-head RMSNorm weight on q and on k, and a
  // SwiGLU feed-forward; its LayerNorms have no affine parameters.
  p.double_block = 2 * (4 * matrix(D, D) + 2 * Dh + matrix(D, 2 * F) + matrix(F, D));
  // Flux2SingleTransformerBlock: one projection to [q, k, v, mlp_in (2F)], the q/k norms, and the
  // output projection over [attention, mlp].
  p.single_block = matrix(D, 3 * D + 2 * F) + 2 * Dh + matrix(D + F, D);
  const int64_t timestep_mlp = matrix(c.timestep_guidance_channels, D) + matrix(D, D);
  // x_embedder, context_embedder, time (+ guidance) embedder, and the three modulation linears
  // shared by every block: double img and txt (6 vectors each), single (3).
  p.embedders = matrix(c.in_channels, D) + matrix(c.joint_attention_dim, D) + timestep_mlp * (c.guidance_embeds ? 2 : 1) +
                2 * matrix(D, 6 * D) + matrix(D, 3 * D);
  p.final_layer = matrix(D, 2 * D) + matrix(D, c.patch_size * c.patch_size * c.out_channels);
  p.total = p.embedders + c.num_layers * p.double_block + c.num_single_layers * p.single_block + p.final_layer;
  return f;
}

}  // namespace fluxmpi::parallel
