#pragma once
// Parameter-count formulas shared by the planner's cost model and the per-family counts
// (partition.cpp, param_counts.cpp). Internal to src/parallel.

#include <cstdint>

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

}  // namespace fluxmpi::parallel::detail
