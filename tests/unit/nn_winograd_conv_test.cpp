// The Winograd convolutions (models/common/winograd_conv.h) against their definitions evaluated in
// float64: the 3x3 convolution with padding 1, and nearest-neighbour doubling followed by it.

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <iostream>

#include "models/common/cpu_gemm.h"
#include "models/common/layers.h"
#include "models/common/winograd_conv.h"
#include "support/tensor_compare.h"

namespace fluxmpi::nn {
namespace {

at::Tensor channels_last(const at::Tensor& t) { return t.contiguous(at::MemoryFormat::ChannelsLast); }

at::Tensor conv_reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::conv2d(x.to(at::kDouble), w.to(at::kDouble), b.defined() ? b.to(at::kDouble) : b, {1, 1}, {1, 1});
}

at::Tensor upsample_reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor up = x.to(at::kDouble).repeat_interleave(2, 2).repeat_interleave(2, 3);
  return at::conv2d(up, w.to(at::kDouble), b.to(at::kDouble), {1, 1}, {1, 1});
}

double max_error(const at::Tensor& got, const at::Tensor& ref) {
  return (got.to(at::kDouble) - ref).abs().max().item<double>() / std::max(1.0, ref.abs().max().item<double>());
}

struct Shapes {
  int64_t batch, c_in, c_out, height, width;
};

// The Winograd path switched on for one scope (it is off by default: winograd_conv.h).
class WinogradOn {
 public:
  WinogradOn() { set_winograd(true); }
  ~WinogradOn() { set_winograd(false); }
  WinogradOn(const WinogradOn&) = delete;
  WinogradOn& operator=(const WinogradOn&) = delete;
};

class WinogradConv : public testing::TestWithParam<Shapes> {
 protected:
  void SetUp() override {
    if (cpu::gemm_provider_f32() != cpu::GemmProvider::OneDnn)
      GTEST_SKIP() << "this process has no oneDNN sgemm: the Winograd path does not apply";
  }
  const WinogradOn on_;
};

TEST_P(WinogradConv, Conv3x3MatchesFloat64AsCloselyAsTheDirectConvolution) {
  const Shapes s = GetParam();
  at::manual_seed(11);
  const at::Tensor x = channels_last(at::silu(at::randn({s.batch, s.c_in, s.height, s.width})));
  const at::Tensor w = at::randn({s.c_out, s.c_in, 3, 3}) / std::sqrt(9.0 * static_cast<double>(s.c_in));
  const at::Tensor b = at::randn({s.c_out}) * 0.1;
  ASSERT_TRUE(winograd_applies(x, w));
  const at::Tensor ref = conv_reference(x, w, b);
  const at::Tensor got = winograd_conv3x3(x, w, b);
  ASSERT_EQ(got.sizes(), ref.sizes());
  EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
  test::expect_close("winograd conv3x3", got, ref, test::kTolFp32);
  const double wino = max_error(got, ref), direct = max_error(at::conv2d(x, w, b, {1, 1}, {1, 1}), ref);
  std::cout << "[ measured ] max |diff| / max(1, max |ref|): winograd " << wino << ", libtorch's direct " << direct << "\n";
  // F(2x2, 3x3)'s transforms hold 0, +-1 and 1/2: its error is of the direct convolution's order.
  EXPECT_LE(wino, std::max(4 * direct, 1e-6)) << "winograd " << wino << " against the direct convolution's " << direct;
}

TEST_P(WinogradConv, UpsampleMatchesDoublingThenConv3x3InFloat64) {
  const Shapes s = GetParam();
  at::manual_seed(12);
  const at::Tensor x = channels_last(at::randn({s.batch, s.c_in, s.height, s.width}));
  const at::Tensor w = at::randn({s.c_out, s.c_in, 3, 3}) / std::sqrt(9.0 * static_cast<double>(s.c_in));
  const at::Tensor b = at::randn({s.c_out}) * 0.1;
  const at::Tensor ref = upsample_reference(x, w, b);
  const at::Tensor got = winograd_upsample2x(x, w, b);
  ASSERT_EQ(got.sizes(), ref.sizes());
  EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
  test::expect_close("winograd upsample2x", got, ref, test::kTolFp32);
}

TEST_P(WinogradConv, IsExactOnSmallIntegers) {
  // Integer pixels and even integer weights: every transform, product and sum is an exact small
  // integer in fp32, so any slip in the transforms' algebra or the tile indexing shows as a difference.
  const Shapes s = GetParam();
  at::manual_seed(13);
  const at::Tensor x = channels_last(at::randint(-3, 4, {s.batch, s.c_in, s.height, s.width}, at::kFloat));
  const at::Tensor w = at::randint(-2, 3, {s.c_out, s.c_in, 3, 3}, at::kFloat) * 2;
  const at::Tensor b = at::randint(-5, 6, {s.c_out}, at::kFloat);
  EXPECT_TRUE(at::equal(winograd_conv3x3(x, w, b).to(at::kDouble), conv_reference(x, w, b))) << "conv3x3";
  EXPECT_TRUE(at::equal(winograd_upsample2x(x, w, b).to(at::kDouble), upsample_reference(x, w, b))) << "upsample2x";
  EXPECT_TRUE(at::equal(winograd_conv3x3(x, w, {}).to(at::kDouble), conv_reference(x, w, {}))) << "conv3x3 without bias";
}

TEST_P(WinogradConv, Bf16StaysNearTheDirectBf16Convolution) {
  if (cpu::gemm_provider_bf16() != cpu::GemmProvider::OneDnn) GTEST_SKIP() << "no oneDNN bf16 GEMM on this CPU";
  const Shapes s = GetParam();
  at::manual_seed(15);
  // The reference sees the bf16-rounded inputs, so the error is the computation's alone.
  const at::Tensor x = channels_last(at::silu(at::randn({s.batch, s.c_in, s.height, s.width})).to(at::kBFloat16));
  const at::Tensor w = (at::randn({s.c_out, s.c_in, 3, 3}) / std::sqrt(9.0 * static_cast<double>(s.c_in))).to(at::kBFloat16);
  const at::Tensor b = (at::randn({s.c_out}) * 0.1).to(at::kBFloat16);
  ASSERT_TRUE(winograd_applies(x, w));
  const at::Tensor ref = conv_reference(x, w, b), up_ref = upsample_reference(x, w, b);
  const at::Tensor got = winograd_conv3x3(x, w, b), up = winograd_upsample2x(x, w, b);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  EXPECT_EQ(up.scalar_type(), at::kBFloat16);
  const double scale = std::max(1.0, ref.abs().max().item<double>());
  test::expect_close("winograd conv3x3 (bf16) / output scale", got.to(at::kDouble) / scale, ref / scale,
                     test::kTolBf16Sanity);
  test::expect_close("winograd upsample2x (bf16) / output scale", up.to(at::kDouble) / scale, up_ref / scale,
                     test::kTolBf16Sanity);
  // Its operands V and U are rounded to bf16 where the direct convolution multiplies the inputs as
  // they are: a few bf16 roundings of the output's scale, against the direct convolution's one.
  const double wino = max_error(got, ref), direct = max_error(at::conv2d(x, w, b, {1, 1}, {1, 1}), ref);
  std::cout << "[ measured ] bf16 max |diff| / max(1, max |ref|): winograd " << wino << ", libtorch's direct " << direct
            << "\n";
  EXPECT_LE(wino, 4 * 3.90625e-3) << "winograd bf16: more than 4 bf16 roundings of the output scale";
}

TEST_P(WinogradConv, DoesNotDependOnTheThreadCount) {
  const Shapes s = GetParam();
  at::manual_seed(14);
  const at::Tensor x = channels_last(at::randn({s.batch, s.c_in, s.height, s.width}));
  const at::Tensor w = at::randn({s.c_out, s.c_in, 3, 3});
  const at::Tensor b = at::randn({s.c_out});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = winograd_conv3x3(x, w, b), one_up = winograd_upsample2x(x, w, b);
  at::set_num_threads(2);
  const at::Tensor two = winograd_conv3x3(x, w, b), two_up = winograd_upsample2x(x, w, b);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one, two));
  EXPECT_TRUE(at::equal(one_up, two_up));
}

// Odd sizes (tiles that leave the image), a 1 x 1 image, a batch of 2, several chunks of tiles.
INSTANTIATE_TEST_SUITE_P(Shapes, WinogradConv,
                         testing::Values(Shapes{1, 16, 32, 5, 7}, Shapes{2, 48, 16, 6, 4}, Shapes{1, 64, 32, 1, 1},
                                         Shapes{1, 32, 64, 70, 45}, Shapes{1, 128, 96, 16, 16}));

TEST(WinogradConvDispatch, IsOffByDefault) {
  EXPECT_FALSE(winograd_enabled());
  const at::Tensor w = at::randn({32, 32, 3, 3});
  const at::Tensor x = at::randn({1, 32, 8, 8}).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(winograd_applies(x, w));
  const at::Tensor b = at::randn({32});
  EXPECT_TRUE(at::equal(nn::conv2d(x, w, b, {1, 1}, {1, 1}), at::conv2d(x, w, b, {1, 1}, {1, 1}))) << "libtorch's convolution";
}

TEST(WinogradConvDispatch, TakesFp32WithEnoughChannelsOnly) {
  if (cpu::gemm_provider_f32() != cpu::GemmProvider::OneDnn) GTEST_SKIP() << "no oneDNN sgemm in this process";
  const WinogradOn on;
  const at::Tensor w = at::randn({32, 32, 3, 3});
  const at::Tensor x = at::randn({1, 32, 8, 8});
  EXPECT_TRUE(winograd_applies(channels_last(x), w));
  EXPECT_TRUE(winograd_applies(x, w)) << "NCHW";
  EXPECT_TRUE(at::equal(winograd_conv3x3(x, w, {}), winograd_conv3x3(channels_last(x), w, {}))) << "NCHW input, same bits";
  // Channels-last in, channels-last out; else NCHW.
  EXPECT_TRUE(winograd_conv3x3(x, w, {}).is_contiguous()) << "NCHW in, NCHW out";
  EXPECT_TRUE(winograd_upsample2x(x, w, at::zeros({32})).is_contiguous()) << "NCHW in, NCHW out";
  EXPECT_TRUE(winograd_conv3x3(channels_last(x), w, {}).is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(winograd_applies(channels_last(x.to(at::kBFloat16)), w), cpu::gemm_provider_bf16() == cpu::GemmProvider::OneDnn)
      << "bf16: where the bf16 GEMM is oneDNN's";
  EXPECT_FALSE(winograd_applies(channels_last(x.to(at::kDouble)), w)) << "float64";
  EXPECT_FALSE(winograd_applies(channels_last(at::randn({1, 8, 8, 8})), at::randn({32, 8, 3, 3}))) << "8 input channels";
  EXPECT_FALSE(winograd_applies(channels_last(x), at::randn({3, 32, 3, 3}))) << "3 output channels";
  // nn::conv2d takes it for 3x3 kernels with stride and padding 1, and leaves the rest to libtorch.
  const at::Tensor b = at::randn({32});
  EXPECT_TRUE(at::equal(conv2d(channels_last(x), w, b, {1, 1}, {1, 1}), winograd_conv3x3(channels_last(x), w, b)));
  set_winograd(false);
  EXPECT_FALSE(winograd_applies(channels_last(x), w)) << "switched off";
  EXPECT_TRUE(at::equal(conv2d(channels_last(x), w, b, {1, 1}, {1, 1}), at::conv2d(channels_last(x), w, b, {1, 1}, {1, 1})));
  set_winograd(true);
}

}  // namespace
}  // namespace fluxmpi::nn
