#pragma once
/// Rotary position embedding of FLUX (diffusers FluxPosEmbed + apply_rotary_emb): per position-id
/// axis i with dim d_i, frequencies 1/10000^(2k/d_i) and angles in float64, cos/sin cast to
/// float32 and repeat-interleaved; axes concatenated. Rotation on interleaved pairs in float32.

#include <ATen/ATen.h>

#include <vector>

namespace fluxmpi::flux {

struct RopeTables {
  at::Tensor cos;  ///< [S, head_dim] float32
  at::Tensor sin;  ///< [S, head_dim] float32
};

/// ids: [S, n_axes] positions (text first, then image) -> tables on ids' device.
RopeTables rope_tables(const at::Tensor& ids, const std::vector<int64_t>& axes_dims, double theta = 10000.0);

/// x: [B, S, H, Dh] (any float dtype) -> rotated, same dtype: x*cos + rot(x)*sin in float32 with
/// rot(x) = (-x1, x0, -x3, x2, ...).
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope);

}  // namespace fluxmpi::flux
