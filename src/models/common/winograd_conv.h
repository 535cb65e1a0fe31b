#pragma once
/// 3x3 convolutions on the CPU by Winograd's minimal filtering (Lavin & Gray, "Fast Algorithms for
/// Convolutional Neural Networks", 2016): the image is cut into tiles of m x m outputs; each tile's
/// 4 x 4 input window d and each 3x3 kernel g are transformed (V = B^T d B, U = G g G^T), the 16
/// positions of the transformed tile are 16 independent products over the input channels (one GEMM
/// each: [tiles, C] x [C, K]), and the output tile is A^T M A. F(2x2, 3x3) computes a 2 x 2 tile
/// with 16 multiplications where the direct convolution needs 36; F(3x3, 2x2), for the 2x2 phase
/// kernels of the VAE's upsampler (vae/upsample_conv.h), 9 outputs with 16 instead of 36.
///
/// Both use the points 0, 1, -1 and infinity, whose transforms hold only 0, +-1 and (in G) 1/2: the
/// fp32 error stays that of the direct convolution (measured on 256 channels against float64:
/// 7e-7 of the output's largest value, direct 3e-7; the larger tiles F(4x4, 3x3) or F(3x3, 3x3)
/// would save more multiplications at 4-6e-6, too much for the 1e-5 parity bound of a decoder of
/// 30 convolutions). Docs: docs/performance.md, "The VAE decoder".
///
/// bf16: the transforms run in fp32 and their results V and U are rounded to bf16 for oneDNN's bf16
/// GEMM (fp32 products and sums), the output rounded once; these two extra roundings leave the
/// result within 1.5-3x the direct bf16 convolution's error (measured: 1.2-5.6e-3 of the output
/// scale against 0.7-3.1e-3), at about 1.25x its speed here.
///
/// Off by default (set_winograd): fluxmpi's numbers are libtorch's direct convolutions until the
/// path has passed the fixture checks in both CI lanes (check-cli sets included), and its bf16
/// breaks nn::conv2d's contract of one rounding from the exact sum (unit_layers_conv_test measured
/// 0.17 of the value where one rounding is 2^-8). fluxmpi-bench-vae --conv winograd switches it on.
///
/// Determinism: the tiles are processed in chunks of a size fixed by the channel counts, each chunk
/// by one thread with its own buffers and single-threaded GEMMs (nn::cpu::gemm), every sum in a fixed
/// order; so the result does not depend on the thread count.

#include <ATen/ATen.h>

namespace fluxmpi::nn {

/// Whether the Winograd path computes conv2d(x, weight, padding 1) for a 3x3 `weight` (and the
/// upsampler's): on, CPU fp32 or bf16 x [B, C, H, W], C and the output channels at least 16 (below
/// that the transforms cost more than the multiplications they save), and oneDNN's GEMM of that
/// dtype in the process (bf16: CPUs with AVX-512). The tiles read and write channels-last memory:
/// other input is copied to it first and the result back to NCHW (the decoder runs channels-last,
/// so neither copy happens there).
bool winograd_applies(const at::Tensor& x, const at::Tensor& weight);

/// conv2d(x, weight, bias, stride 1, padding 1) for weight [K, C, 3, 3], bias [K] (or undefined),
/// x fp32 or bf16 on the CPU. The result is of x's dtype, channels-last where x is, else NCHW.
at::Tensor winograd_conv3x3(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// conv2d(upsample_nearest2d(x, 2x), weight, bias, padding 1) for weight [K, C, 3, 3], computed as
/// the upsampler's four 2x2 phase convolutions at x's resolution (vae/upsample_conv.h), each written
/// into its pixels of the doubled image. x fp32 or bf16 on the CPU; the result [B, K, 2H, 2W] is of
/// x's dtype, channels-last where x is, else NCHW.
at::Tensor winograd_upsample2x(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// Process-wide switch of the Winograd path (default off, see above), for benchmarks and tests.
void set_winograd(bool on);
bool winograd_enabled();

}  // namespace fluxmpi::nn
