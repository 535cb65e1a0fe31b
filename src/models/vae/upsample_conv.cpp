// Semantics of diffusers Upsample2D (interpolate "nearest", scale 2, then its 3x3 conv), computed
// at the input resolution; the derivation is in upsample_conv.h.
#include "models/vae/upsample_conv.h"

#include <vector>

#include "models/common/layers.h"
#include "models/common/tensor_utils.h"
#include "models/common/winograd_conv.h"

namespace fluxmpi::vae {

at::Tensor upsample_phase_weights(const at::Tensor& weight) {
  nn::check_shape(weight, {-1, -1, 3, 3}, "upsample conv weight [C_out, C_in, 3, 3]");
  const int64_t O = weight.size(0), I = weight.size(1);
  // Taps first ([3, 3, O, I]), so that the sums below add contiguous [O, I] planes.
  const at::Tensor w = weight.to(at::kFloat).permute({2, 3, 0, 1}).contiguous();
  // The 2-tap kernel of one phase along the first dim of `k`: the doubled image repeats each input
  // row, so an even output row sees (row i-1: w0, row i: w1 + w2) and an odd one
  // (row i: w0 + w1, row i+1: w2).
  const auto taps = [](const at::Tensor& k, int64_t parity) {
    return parity == 0 ? at::stack({k[0], k[1] + k[2]}) : at::stack({k[0] + k[1], k[2]});
  };
  std::vector<at::Tensor> phases;  // each [2 (row tap), 2 (column tap), O, I]
  for (int64_t a = 0; a < 2; ++a) {
    const at::Tensor rows = taps(w, a);  // [2, 3, O, I]
    for (int64_t b = 0; b < 2; ++b) phases.push_back(taps(rows.transpose(0, 1), b).transpose(0, 1));
  }
  // [4, 2, 2, O, I] -> [4, O, I, 2, 2] -> [4 O, I, 2, 2]
  return at::stack(phases).permute({0, 3, 4, 1, 2}).reshape({4 * O, I, 2, 2}).to(weight.scalar_type());
}

at::Tensor upsample2x_conv3x3(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // x: [B, C_in, H, W]
  const int64_t B = x.size(0), C = weight.size(0), H = x.size(2), W = x.size(3);
  nn::check_shape(x, {-1, weight.size(1), -1, -1}, "upsample conv input [B, C_in, H, W]");
  if (nn::winograd_applies(x, weight)) return nn::winograd_upsample2x(x, weight, bias);
  // With padding 1 the 2x2 kernels' output (p, q) reads input rows p-1, p and columns q-1, q:
  // phase (a, b) of output pixel (2i + a, 2j + b) is y[(2a + b) * C + c, i + a, j + b].
  const int64_t stride[] = {1, 1}, padding[] = {1, 1};
  const at::Tensor y = nn::conv2d(x, upsample_phase_weights(weight), bias.repeat({4}), stride,
                                  padding);  // [B, 4C, H + 1, W + 1]
  at::Tensor out = at::empty({B, C, 2 * H, 2 * W}, x.options().memory_format(x.suggest_memory_format()));
  const at::Tensor phases = out.view({B, C, H, 2, W, 2});
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b)
      phases.select(5, b).select(3, a).copy_(y.narrow(1, (2 * a + b) * C, C).narrow(2, a, H).narrow(3, b, W));
  return out;
}

}  // namespace fluxmpi::vae
