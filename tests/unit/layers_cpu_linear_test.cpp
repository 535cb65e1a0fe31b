// nn::linear (models/common/cpu_linear.h): oneDNN's GEMM on weights kept transposed in memory,
// against at::linear in float64 over the shapes the models use (2-D and 3-D inputs, strided rows,
// a vector of modulation, no rows), with and without a bias, weights fused and narrowed as
// nn::fuse_linears leaves them; the layout changes no value; other dtypes, weights in the usual
// layout and the benchmarks' switch are at::linear. Large weights (nn::empty_large) live in
// 2 MiB-aligned mappings advised for huge pages, which go away with the tensor.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>
#include <c10/util/StringUtil.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "models/common/cpu_gemm.h"
#include "models/common/cpu_linear.h"
#include "models/common/large_alloc.h"
#include "models/common/layers.h"
#include "support/tensor_compare.h"

namespace fluxmpi::nn {
namespace {

// fp32 sums over K <= 3072 terms of products of N(0, 1) values: relative to max(1, max |ref|).
constexpr double kTol = 1e-5;

bool have_onednn() { return cpu::gemm_provider_f32() == cpu::GemmProvider::OneDnn; }

void expect_like_float64(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                         const std::string& what) {
  at::Tensor ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.defined() ? b.to(at::kDouble) : at::Tensor());
  ASSERT_EQ(y.sizes(), ref.sizes()) << what;
  if (ref.numel() == 0) return;
  const double scale = std::max(1.0, ref.abs().max().item<double>());
  EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>() / scale, kTol) << what;
}

class CpuLinear : public testing::Test {
 protected:
  c10::InferenceMode guard;
};

TEST_F(CpuLinear, GemmLayoutKeepsTheValuesAndTransposesTheStorage) {
  at::manual_seed(1);
  at::Tensor w = at::randn({48, 32});
  at::Tensor t = gemm_layout(w);
  EXPECT_TRUE(at::equal(t, w));
  if (!have_onednn()) GTEST_SKIP() << "no oneDNN sgemm in this process: the layout stays";
  EXPECT_EQ(t.stride(0), 1);
  EXPECT_EQ(t.stride(1), 48);
  EXPECT_EQ(gemm_layout(t).data_ptr(), t.data_ptr());  // already in it
  // Other dtypes keep theirs.
  at::Tensor h = w.to(at::kBFloat16);
  EXPECT_EQ(gemm_layout(h).data_ptr(), h.data_ptr());
}

TEST_F(CpuLinear, GemmLayoutCatIsTheConcatenationInTheGemmLayout) {
  at::manual_seed(2);
  // Sizes off the transpose's 32 x 32 tiles; one part already in the GEMM's layout.
  const std::vector<at::Tensor> parts = {at::randn({70, 45}), gemm_layout(at::randn({33, 45})), at::randn({1, 45})};
  const at::Tensor fused = gemm_layout_cat(parts);
  EXPECT_TRUE(at::equal(fused, at::cat(parts, 0)));
  if (!have_onednn()) GTEST_SKIP() << "no oneDNN sgemm in this process: the layout stays";
  EXPECT_EQ(fused.stride(0), 1);
  EXPECT_EQ(fused.stride(1), 104);
  const at::Tensor big = at::randn({97, 131});
  EXPECT_TRUE(at::equal(gemm_layout(big), big));
}

TEST_F(CpuLinear, MatchesFloat64OnTheModelsShapes) {
  at::manual_seed(2);
  struct Case {
    std::vector<int64_t> x;
    int64_t out;
  };
  for (const Case& c : {Case{{1, 512, 96}, 288}, Case{{2, 77, 64}, 200}, Case{{1, 96}, 576}, Case{{3, 1, 40}, 7},
                        Case{{1, 0, 32}, 16}, Case{{130, 33}, 1}}) {
    const int64_t in = c.x.back();
    at::Tensor x = at::randn(c.x), w = at::randn({c.out, in}) / std::sqrt(static_cast<double>(in)),
               b = at::randn({c.out});
    const at::Tensor wl = gemm_layout(w);
    const std::string what = "x " + c10::str(c.x) + " out " + std::to_string(c.out);
    expect_like_float64(linear(x, wl, b), x, w, b, what + " with bias");
    expect_like_float64(linear(x, wl, at::Tensor()), x, w, at::Tensor(), what + " without bias");
  }
}

TEST_F(CpuLinear, StridedRowsAndFusedWeights) {
  at::manual_seed(3);
  // Rows of a wider tensor (a window of the joint sequence), and a non-contiguous input.
  at::Tensor joint = at::randn({1, 100, 64});
  at::Tensor window = joint.narrow(1, 30, 50), transposed = at::randn({64, 40}).t().unsqueeze(0);
  // fuse_linears: q, k, v read from one fused weight in the GEMM layout.
  Linear q(64, 48), k(64, 48), v(64, 16);
  for (Linear* l : {&q, &k, &v}) {
    (*l)->weight.set_data(at::randn({(*l)->out_features, 64}) / 8);
    (*l)->bias.set_data(at::randn({(*l)->out_features}));
  }
  const at::Tensor wq = q->weight.clone(), bq = q->bias.clone(), wv = v->weight.clone(), bv = v->bias.clone();
  const FusedLinear fused = fuse_linears({q, k, v});
  const at::Tensor &fw = fused.weight, &fb = fused.bias;
  if (have_onednn()) EXPECT_EQ(fw.stride(0), 1);
  for (const at::Tensor& x : {window, transposed}) {
    expect_like_float64(q->forward(x), x, wq, bq, "q of the fused weight");
    expect_like_float64(v->forward(x), x, wv, bv, "v of the fused weight");
    expect_like_float64(linear(x, fw, fb), x, fw, fb, "the fused projection");
  }
}

TEST_F(CpuLinear, EveryOtherCaseIsAtLinear) {
  at::manual_seed(4);
  at::Tensor x = at::randn({5, 24}), w = at::randn({12, 24}), b = at::randn({12});
  // A weight in the usual layout, a bf16 product: at::linear's bits.
  EXPECT_TRUE(at::equal(linear(x, w, b), at::linear(x, w, b)));
  const at::Tensor xh = x.to(at::kBFloat16), wh = w.to(at::kBFloat16), bh = b.to(at::kBFloat16);
  EXPECT_TRUE(at::equal(linear(xh, wh, bh), at::linear(xh, wh, bh)));
  const at::Tensor wl = gemm_layout(w);
  // Switched off (benchmarks), the same.
  set_onednn_linear(false);
  const at::Tensor off = linear(x, wl, b);
  set_onednn_linear(true);
  EXPECT_TRUE(at::equal(off, at::linear(x, wl, b)));
}

// The VmFlags line of the mapping of /proc/self/smaps that holds `address`; empty when none does.
std::string mapping_flags(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  const uintptr_t want = reinterpret_cast<uintptr_t>(address);
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') in = begin <= want && want < end;
    else if (in && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return {};
}

TEST_F(CpuLinear, LargeTensorsHaveHugePageMappingsOfTheirOwn) {
  const int64_t rows = 1024, cols = 1537;  // 6 MiB and 4 KiB of floats: not a multiple of 2 MiB
  at::Tensor w = empty_large({rows, cols}, at::kFloat);
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{rows, cols}));
  EXPECT_TRUE(w.is_contiguous());
  void* start = w.data_ptr();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(start) % (uintptr_t{2} << 20), 0u);
  const std::string flags = mapping_flags(start);
  ASSERT_FALSE(flags.empty()) << "no mapping holds the tensor's data";
  // MADV_HUGEPAGE marks the mapping wherever the kernel has transparent huge pages at all.
  const bool thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
  if (thp) EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  w.fill_(1.5f);  // every byte writable
  EXPECT_EQ(w.sum().item<double>(), 1.5 * rows * cols);
  // A weight laid out for the GEMM is such a tensor too.
  at::Tensor t = gemm_layout(w);
  if (have_onednn()) EXPECT_EQ(mapping_flags(t.data_ptr()).find(" hg") != std::string::npos, thp);
  w.reset();
  EXPECT_TRUE(mapping_flags(start).empty()) << "the mapping outlived its tensor";
  // Below kLargeTensorBytes: at::empty, in the allocator's heap. glibc marks its own mappings
  // MADV_HUGEPAGE too when told to (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which scripts/test.sh
  // sets): the flag then cannot tell the two apart.
  at::Tensor small = empty_large({256, 1023}, at::kFloat);
  const char* env_tunables = std::getenv("GLIBC_TUNABLES");
  const std::string tunables = env_tunables != nullptr ? env_tunables : "";
  const bool heap_in_huge_pages = tunables.find("glibc.malloc.hugetlb=") != std::string::npos &&
                                  tunables.find("glibc.malloc.hugetlb=0") == std::string::npos;
  if (!heap_in_huge_pages) EXPECT_EQ(mapping_flags(small.data_ptr()).find(" hg"), std::string::npos);
  at::Tensor half = empty_large({rows, cols * 2}, at::kBFloat16);  // the size in bytes decides
  EXPECT_EQ(half.scalar_type(), at::kBFloat16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(half.data_ptr()) % (uintptr_t{2} << 20), 0u);
}

}  // namespace
}  // namespace fluxmpi::nn
