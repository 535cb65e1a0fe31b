// vae::group_norm (models/vae/norm.h) on the decoder's channels-last activations: in fp32 it is the
// NCHW group norm (the channels-last kernel group_norm_nhwc, against float64), with SiLU fused where
// asked, and in bf16 it stays within the bf16 sanity bound of an fp32 reference (the check that
// libtorch 1.13's own bf16 channels-last kernel fails by two orders of magnitude).

#include <ATen/Parallel.h>

#include <gtest/gtest.h>

#include "models/vae/norm.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {

nn::GroupNorm make_norm(int64_t groups, int64_t channels) {
  nn::GroupNorm norm(groups, channels, 1e-6);
  at::manual_seed(3);
  norm->weight.set_data(at::randn({channels}));
  norm->bias.set_data(at::randn({channels}));
  return norm;
}

// group_norm_nhwc switched on (or off) for one scope; it is off by default (norm.h).
class NhwcKernel {
 public:
  explicit NhwcKernel(bool on) { set_group_norm_nhwc(on); }
  ~NhwcKernel() { set_group_norm_nhwc(false); }
  NhwcKernel(const NhwcKernel&) = delete;
  NhwcKernel& operator=(const NhwcKernel&) = delete;
};

TEST(VaeGroupNorm, ChannelsLastFp32MatchesNchw) {
  const nn::GroupNorm norm = make_norm(8, 32);
  const at::Tensor x = at::randn({2, 32, 12, 10}) * 3 + 1;
  const at::Tensor ref = at::group_norm(x, 8, norm->weight, norm->bias, 1e-6);
  EXPECT_FALSE(group_norm_nhwc_applies(x.contiguous(at::MemoryFormat::ChannelsLast))) << "off by default";
  for (bool kernel : {false, true}) {
    const NhwcKernel sw(kernel);
    test::expect_close(kernel ? "group norm, channels-last fp32 (group_norm_nhwc)" : "group norm, channels-last fp32",
                       group_norm(norm, x.contiguous(at::MemoryFormat::ChannelsLast)), ref, test::kTolFp32);
  }
}

TEST(VaeGroupNorm, ChannelsLastKernelMatchesFloat64AndKeepsTheFormat) {
  const NhwcKernel on(true);
  const nn::GroupNorm norm = make_norm(4, 64);
  // 700 pixels: several chunks of the statistics pass and a short last one; an offset mean.
  const at::Tensor x = (at::randn({2, 64, 35, 20}) * 3 + 5).contiguous(at::MemoryFormat::ChannelsLast);
  ASSERT_TRUE(group_norm_nhwc_applies(x));
  EXPECT_FALSE(group_norm_nhwc_applies(x.contiguous())) << "NCHW input goes to libtorch";
  const at::Tensor ref = at::group_norm(x.to(at::kDouble), 4, norm->weight.to(at::kDouble), norm->bias.to(at::kDouble), 1e-6);
  const at::Tensor got = group_norm(norm, x);
  EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
  test::expect_close("group norm (channels-last kernel) vs float64", got, ref, test::kTolFp32);
  const at::Tensor fused = group_norm_silu(norm, x);
  EXPECT_TRUE(fused.is_contiguous(at::MemoryFormat::ChannelsLast));
  test::expect_close("group norm + SiLU (channels-last kernel) vs float64", fused, at::silu(ref), test::kTolFp32);
  // Without the kernel (NCHW input) the pair is libtorch's group norm and SiLU.
  test::expect_close("group norm + SiLU, NCHW", group_norm_silu(norm, x.contiguous()), at::silu(ref), test::kTolFp32);
}

TEST(VaeGroupNorm, ChannelsLastKernelDoesNotDependOnTheThreadCount) {
  const NhwcKernel on(true);
  const nn::GroupNorm norm = make_norm(8, 32);
  const at::Tensor x = at::randn({1, 32, 40, 40}).contiguous(at::MemoryFormat::ChannelsLast);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = group_norm_silu(norm, x);
  at::set_num_threads(2);
  const at::Tensor two = group_norm_silu(norm, x);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one, two));
}

TEST(VaeGroupNorm, ChannelsLastBf16StaysWithinTheSanityBound) {
  const nn::GroupNorm norm = make_norm(8, 32);
  const at::Tensor x = (at::randn({1, 32, 64, 64}) * 3 + 1).to(at::kBFloat16);
  const at::Tensor ref = at::group_norm(x.to(at::kFloat), 8, norm->weight.to(at::kBFloat16).to(at::kFloat),
                                        norm->bias.to(at::kBFloat16).to(at::kFloat), 1e-6);
  nn::GroupNorm bf16 = make_norm(8, 32);
  bf16->weight.set_data(bf16->weight.to(at::kBFloat16));
  bf16->bias.set_data(bf16->bias.to(at::kBFloat16));
  for (bool kernel : {false, true}) {
    const NhwcKernel sw(kernel);
    const at::Tensor got = group_norm(bf16, x.contiguous(at::MemoryFormat::ChannelsLast));
    EXPECT_EQ(got.scalar_type(), at::kBFloat16);
    test::expect_close(kernel ? "group norm, channels-last bf16 (group_norm_nhwc)" : "group norm, channels-last bf16", got,
                       ref, test::kTolBf16Sanity);
  }
}

}  // namespace
}  // namespace fluxmpi::vae
