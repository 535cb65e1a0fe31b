#include "models/flux/rope.h"

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::flux {

RopeTables rope_tables(const at::Tensor& ids, const std::vector<int64_t>& axes_dims, double theta) {
  nn::check_shape(ids, {-1, static_cast<int64_t>(axes_dims.size())}, "rope ids [S, axes]");
  at::Tensor pos = ids.to(at::kFloat);
  std::vector<at::Tensor> cos_parts, sin_parts;
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(ids.device());
  for (size_t i = 0; i < axes_dims.size(); ++i) {
    const int64_t d = axes_dims[i];
    at::Tensor freqs = 1.0 / at::pow(theta, at::arange(0, d, 2, f64) / static_cast<double>(d));
    at::Tensor angles = at::outer(pos.select(1, static_cast<int64_t>(i)).to(at::kDouble), freqs);  // [S, d/2]
    cos_parts.push_back(angles.cos().repeat_interleave(2, 1).to(at::kFloat));
    sin_parts.push_back(angles.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  return {at::cat(cos_parts, -1), at::cat(sin_parts, -1)};
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope) {
  // x: [B, S, H, Dh]; tables [S, Dh] broadcast over batch and heads.
  nn::check_shape(x, {-1, rope.cos.size(0), -1, rope.cos.size(1)}, "apply_rope input [B, S, H, Dh]");
  at::Tensor cos = rope.cos.unsqueeze(0).unsqueeze(2);
  at::Tensor sin = rope.sin.unsqueeze(0).unsqueeze(2);
  at::Tensor pairs = x.reshape({x.size(0), x.size(1), x.size(2), -1, 2});
  at::Tensor rotated = at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(3);
  return (x.to(at::kFloat) * cos + rotated.to(at::kFloat) * sin).to(x.scalar_type());
}

}  // namespace fluxmpi::flux
