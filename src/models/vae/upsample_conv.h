#pragma once
/// diffusers Upsample2D's nearest-neighbour doubling followed by its 3x3 convolution, computed
/// without the doubled image: each output pixel of the 2H x 2W result reads a 3x3 window of the
/// doubled image, which covers only a 2x2 window of the input, the same for all output pixels of
/// one of the four phases (row parity, column parity). So the result is four 2x2 convolutions of
/// the input whose weights are sums of the 3x3 weights' rows and columns, interleaved: 16 instead
/// of 36 multiply-adds per input pixel and channel pair, and no 4x-sized intermediate. The sums of
/// weights change the rounding of the products, not the value (fp32: within a few ulps).

#include <ATen/ATen.h>

namespace fluxmpi::vae {

/// The four phase kernels of a 3x3 kernel `weight` [C_out, C_in, 3, 3], computed in fp32 and
/// returned in `weight`'s dtype: [4 * C_out, C_in, 2, 2], phase (a, b) (row parity a, column
/// parity b) at rows (2a + b) * C_out ... For phase a the kernel's two rows are (w0, w1 + w2) when
/// a = 0 and (w0 + w1, w2) when a = 1; likewise for the columns.
at::Tensor upsample_phase_weights(const at::Tensor& weight);

/// conv2d(upsample_nearest2d(x, 2x), weight, bias, padding 1) for x: [B, C_in, H, W],
/// weight [C_out, C_in, 3, 3], bias [C_out] -> [B, C_out, 2H, 2W] in x's memory format.
at::Tensor upsample2x_conv3x3(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace fluxmpi::vae
