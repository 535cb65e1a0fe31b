#pragma once
// Parameter-count and memory formulas shared by the planner's cost model, the per-family counts
// and the text-encoder split (cost_model.cpp, param_counts.cpp, text_split.cpp). Internal to
// src/parallel.

#include <algorithm>
#include <cstdint>

#include "io/flux2_configs.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel::detail {

// Sinusoidal channels of diffusers' Timesteps projection in FLUX's time/guidance embedders.
constexpr int64_t kTimestepChannels = 256;
// The MLP width of FLUX blocks relative to D (FeedForward mult and single blocks' mlp_ratio).
constexpr int64_t kMlpRatio = 4;

inline int64_t linear(int64_t in, int64_t out) { return in * out + out; }
inline int64_t conv(int64_t in, int64_t out, int64_t kernel) { return in * out * kernel * kernel + out; }
// LayerNorm / GroupNorm with affine weight and bias.
inline int64_t affine_norm(int64_t channels) { return 2 * channels; }

inline int64_t vae_resnet(int64_t in, int64_t out) {
  return affine_norm(in) + conv(in, out, 3) + affine_norm(out) + conv(out, out, 3) + (in != out ? conv(in, out, 1) : 0);
}

// Bytes of the attention score chunk the math path holds: heads are split into chunks of at
// most `chunk_limit` bytes, but one head's [Lq, Lk] scores are never split. No limit: all heads.
inline uint64_t score_chunk_bytes(int64_t batch_heads, int64_t lq, int64_t lk, int64_t dtype_bytes, int64_t chunk_limit) {
  const int64_t per_head = lq * lk * dtype_bytes;
  if (chunk_limit <= 0) return static_cast<uint64_t>(batch_heads * per_head);
  const int64_t heads_per_chunk = std::max<int64_t>(1, chunk_limit / std::max<int64_t>(per_head, 1));
  return static_cast<uint64_t>(std::min(batch_heads, heads_per_chunk) * per_head);
}

// A decoder-only text encoder's working set for one prompt of S tokens: the residual stream and
// the layer's tensors, the gated MLP's three [S, I] tensors, the scores of all heads, and the
// stacked hidden states kept.
inline uint64_t llm_text_activation_bytes(const io::LlmShape& c, int64_t S, int64_t dtype_bytes, int64_t chunk_limit) {
  const int64_t b = dtype_bytes;
  const int64_t width = std::max(c.hidden_size, c.num_attention_heads * c.head_dim);
  return static_cast<uint64_t>(kTextStreamTensors * S * width * b + 3 * S * c.intermediate_size * b +
                               3 * S * c.hidden_size * b) +
         kScoreTensors * score_chunk_bytes(c.num_attention_heads, S, S, b, chunk_limit);
}

}  // namespace fluxmpi::parallel::detail
