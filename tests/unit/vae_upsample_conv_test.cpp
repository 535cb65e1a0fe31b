// The upsample conv computed as four 2x2 convolutions at the input resolution
// (models/vae/upsample_conv.h) against its definition: nearest-neighbour doubling, then the 3x3
// convolution, evaluated in float64.

#include <gtest/gtest.h>

#include "models/vae/upsample_conv.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {

// conv2d(upsample_nearest2d(x, 2x), w, b, padding 1) in float64.
at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor x64 = x.to(at::kDouble);
  const at::Tensor up = x64.repeat_interleave(2, 2).repeat_interleave(2, 3);
  return at::conv2d(up, w.to(at::kDouble), b.to(at::kDouble), {1, 1}, {1, 1});
}

struct Shapes {
  int64_t batch, c_in, c_out, height, width;
};

class UpsampleConv : public testing::TestWithParam<Shapes> {};

TEST_P(UpsampleConv, MatchesDoublingThenConv3x3InFp32) {
  const Shapes s = GetParam();
  at::manual_seed(7);
  const at::Tensor x = at::randn({s.batch, s.c_in, s.height, s.width});
  const at::Tensor w = at::randn({s.c_out, s.c_in, 3, 3}) * 0.3;
  const at::Tensor b = at::randn({s.c_out});
  const at::Tensor ref = reference(x, w, b);
  for (const bool channels_last : {false, true}) {
    const at::Tensor in = channels_last ? x.contiguous(at::MemoryFormat::ChannelsLast) : x;
    const at::Tensor got = upsample2x_conv3x3(in, w, b);
    ASSERT_EQ(got.sizes(), ref.sizes());
    EXPECT_TRUE(got.is_contiguous(in.suggest_memory_format())) << "the output keeps the input's memory format";
    test::expect_close(channels_last ? "upsample conv (channels-last)" : "upsample conv (NCHW)", got, ref,
                       test::kTolFp32);
  }
}

TEST_P(UpsampleConv, StaysWithinTheBf16SanityBound) {
  const Shapes s = GetParam();
  at::manual_seed(8);
  const at::Tensor x = at::randn({s.batch, s.c_in, s.height, s.width});
  const at::Tensor w = at::randn({s.c_out, s.c_in, 3, 3}) * 0.3;
  const at::Tensor b = at::randn({s.c_out});
  // The reference sees the bf16-rounded inputs, so the bound measures the computation alone.
  const at::Tensor xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16), bb = b.to(at::kBFloat16);
  const at::Tensor got = upsample2x_conv3x3(xb.contiguous(at::MemoryFormat::ChannelsLast), wb, bb);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  const at::Tensor ref = reference(xb, wb, bb);
  const double scale = std::max(1.0, ref.abs().max().item<double>());
  test::expect_close("upsample conv (bf16) / output scale", got.to(at::kDouble) / scale, ref / scale,
                     test::kTolBf16Sanity);
}

INSTANTIATE_TEST_SUITE_P(Shapes, UpsampleConv,
                         testing::Values(Shapes{1, 3, 4, 5, 7}, Shapes{2, 16, 8, 4, 4}, Shapes{1, 32, 32, 9, 6},
                                         Shapes{1, 8, 8, 1, 1}));

TEST(UpsamplePhaseWeights, SumTheRowsAndColumnsEachPhaseSees) {
  // One output and one input channel: the phase kernels can be written down by hand.
  const at::Tensor w = at::arange(1, 10, at::kFloat).view({1, 1, 3, 3});  // rows (1 2 3) (4 5 6) (7 8 9)
  const at::Tensor p = upsample_phase_weights(w);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{4, 1, 2, 2}));
  // phase (0, 0): rows (w0, w1 + w2), columns (c0, c1 + c2)
  EXPECT_TRUE(at::equal(p[0][0], at::tensor({1.f, 5.f, 11.f, 28.f}).view({2, 2})));
  // phase (0, 1): rows (w0, w1 + w2), columns (c0 + c1, c2)
  EXPECT_TRUE(at::equal(p[1][0], at::tensor({3.f, 3.f, 24.f, 15.f}).view({2, 2})));
  // phase (1, 0): rows (w0 + w1, w2), columns (c0, c1 + c2)
  EXPECT_TRUE(at::equal(p[2][0], at::tensor({5.f, 16.f, 7.f, 17.f}).view({2, 2})));
  // phase (1, 1): rows (w0 + w1, w2), columns (c0 + c1, c2)
  EXPECT_TRUE(at::equal(p[3][0], at::tensor({12.f, 9.f, 15.f, 9.f}).view({2, 2})));
}

}  // namespace
}  // namespace fluxmpi::vae
