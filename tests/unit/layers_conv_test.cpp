// nn::conv2d in 16-bit dtypes on the CPU: whichever kernel libtorch picks, the products are summed in
// fp32 and the result rounded once. libtorch 1.13 sums bf16 convolutions in bf16 when it does not
// take oneDNN (CPUs without AVX-512, or oneDNN switched off): that is emulated here by switching
// oneDNN off, libtorch's own switch (torch.backends.mkldnn.enabled in Python).

#include <gtest/gtest.h>

#include <iostream>
#include <vector>

#include "models/common/layers.h"
#include "models/common/tensor_utils.h"
#include "support/onednn_switch.h"

namespace fluxmpi::nn {
namespace {

using test::OneDnnSwitch;

// max over elements of |got - ref| / (|ref| + floor): the error in units of the reference value,
// with a floor for outputs near zero (where a relative error says nothing).
double worst_relative_error(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor r = ref.to(at::kDouble);
  const double floor = 1e-2 * r.abs().max().item<double>();
  return ((got.to(at::kDouble) - r).abs() / (r.abs() + floor)).max().item<double>();
}

TEST(Conv2dSums, Fp32IsAlwaysExact) {
  EXPECT_TRUE(cpu_conv_sums_in_fp32(at::kFloat));
  OneDnnSwitch off(false);
  EXPECT_TRUE(cpu_conv_sums_in_fp32(at::kFloat));
}

TEST(Conv2dSums, Bf16ConvolutionIsOneRoundingFromTheExactResultWithAndWithoutOneDnn) {
  at::manual_seed(7);
  // A VAE-like 3x3 convolution of 128 channels: 1152 products per output.
  const at::Tensor x = at::randn({1, 128, 12, 16}).to(at::kBFloat16);
  const at::Tensor w = (at::randn({64, 128, 3, 3}) / 30).to(at::kBFloat16);
  const at::Tensor b = at::randn({64}).to(at::kBFloat16);
  const std::vector<int64_t> stride{1, 1}, padding{1, 1};
  const at::Tensor exact = at::conv2d(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble), stride, padding);
  // One rounding to bf16 (8 significant bits) is at most half a unit in the last place: 2^-8 of the value.
  constexpr double kOneRounding = 1.0 / 256;
  for (bool onednn : {true, false}) {
    OneDnnSwitch sw(onednn);
    const at::Tensor got = nn::conv2d(x, w, b, stride, padding);
    EXPECT_EQ(got.scalar_type(), at::kBFloat16);
    const double err = worst_relative_error(got, exact);
    std::cout << "[ measured ] bf16 conv, oneDNN " << (onednn ? "on" : "off") << ": worst error " << err
              << " of the value (one rounding: " << kOneRounding << "); libtorch sums in fp32: "
              << cpu_conv_sums_in_fp32(at::kBFloat16) << "\n";
    EXPECT_LE(err, kOneRounding) << "oneDNN " << (onednn ? "on" : "off");
  }
  OneDnnSwitch off(false);
  std::cout << "[ measured ] libtorch's own bf16 conv, oneDNN off: worst error "
            << worst_relative_error(at::conv2d(x, w, b, stride, padding), exact) << " of the value\n";
}

TEST(Conv2dSums, StridedConvolutionTakesTheSameRoute) {
  at::manual_seed(8);
  const at::Tensor x = at::randn({2, 64, 9, 11}).to(at::kBFloat16);
  const at::Tensor w = (at::randn({64, 64, 3, 3}) / 24).to(at::kBFloat16);
  const std::vector<int64_t> stride{2, 2}, no_padding{0, 0};
  const at::Tensor exact = at::conv2d(x.to(at::kDouble), w.to(at::kDouble), at::Tensor(), stride, no_padding);
  OneDnnSwitch off(false);
  const at::Tensor got = nn::conv2d(x, w, at::Tensor(), stride, no_padding);
  EXPECT_EQ(got.sizes(), exact.sizes());
  EXPECT_LE(worst_relative_error(got, exact), 1.0 / 256);
}

}  // namespace
}  // namespace fluxmpi::nn
