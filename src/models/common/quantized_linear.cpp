#include "models/common/quantized_linear.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "core/error.h"
#include "io/dequantize.h"

namespace fluxmpi::nn {
namespace {

std::atomic<bool> panels_on{true};

// About 2^20 weights per panel (4 MiB in float32, 2 MiB in bf16): large enough for an efficient
// GEMM over it, small enough to stay in the last-level cache while the GEMM reads it.
constexpr int64_t kPanelElements = int64_t{1} << 20;

int64_t panel_rows(int64_t rows, int64_t in_features) {
  return std::max<int64_t>(16, std::min<int64_t>(rows, kPanelElements / std::max<int64_t>(in_features, 1)));
}

}  // namespace

uint64_t quantized_scratch_bytes(int64_t tokens, int64_t in_features, int64_t dtype_bytes) {
  const int64_t panel = panel_rows(kPanelElements, in_features);
  return static_cast<uint64_t>(panel * in_features * (4 + dtype_bytes) + tokens * panel * dtype_bytes);
}

int64_t QuantizedWeight::out_features() const {
  int64_t n = 0;
  for (const Run& r : runs) n += r.rows();
  return n;
}

int64_t QuantizedWeight::bytes() const {
  int64_t n = 0;
  for (const Run& r : runs) n += r.bytes.numel();
  return n;
}

std::string QuantizedWeight::dtype_text() const {
  std::string s;
  for (const Run& r : runs) {
    const std::string name = io::dtype_name(r.dtype);
    if (s.find(name) == std::string::npos) s += (s.empty() ? "" : "+") + name;
  }
  return s;
}

namespace {

// Rows [begin, end) of `w` into dst (row stride ld): float32, or bf16 bits.
template <class Out>
void rows_into(const QuantizedWeight& w, int64_t begin, int64_t end, Out* dst, int64_t ld) {
  int64_t run_start = 0;
  for (const QuantizedWeight::Run& r : w.runs) {
    const int64_t run_end = run_start + r.rows();
    const int64_t b = std::max(begin, run_start), e = std::min(end, run_end);
    if (b < e) {
      const uint8_t* src = r.bytes.data_ptr<uint8_t>() + (b - run_start) * r.bytes.size(1);
      if constexpr (std::is_same_v<Out, float>) io::dequantize_rows(r.dtype, src, e - b, w.in_features, dst + (b - begin) * ld, ld);
      else io::dequantize_rows_bf16(r.dtype, src, e - b, w.in_features, dst + (b - begin) * ld, ld);
    }
    run_start = run_end;
  }
}

// Rows [begin, begin + dst.size(0)) into dst ([n, in_features], float32 or bf16, contiguous rows),
// the rows spread over the intra-op threads (each row's blocks are independent).
void dequantize_into(const QuantizedWeight& w, int64_t begin, const at::Tensor& dst) {
  const int64_t n = dst.size(0), ld = dst.stride(0);
  if (dst.scalar_type() == at::kFloat) {
    float* p = dst.data_ptr<float>();
    at::parallel_for(0, n, 8, [&](int64_t b, int64_t e) { rows_into(w, begin + b, begin + e, p + b * ld, ld); });
  } else {
    FLUX_CHECK(dst.scalar_type() == at::kBFloat16, "dequantize into ", dst.scalar_type());
    uint16_t* p = reinterpret_cast<uint16_t*>(dst.data_ptr<at::BFloat16>());
    at::parallel_for(0, n, 8, [&](int64_t b, int64_t e) { rows_into(w, begin + b, begin + e, p + b * ld, ld); });
  }
}

// The dtype the weight is dequantized into for a product in `dtype`: directly when it is float32
// or bf16 (the values of diffusers' fp16 weight cast to it), else float32 and then a cast.
at::ScalarType buffer_dtype(at::ScalarType dtype) { return dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat; }

}  // namespace

void QuantizedWeight::dequantize_rows(int64_t begin, int64_t end, float* dst, int64_t ld) const {
  rows_into(*this, begin, end, dst, ld);
}

at::Tensor QuantizedWeight::dequantize(at::ScalarType dtype) const {
  at::Tensor w = at::empty({out_features(), in_features}, buffer_dtype(dtype));
  dequantize_into(*this, 0, w);
  return w.scalar_type() == dtype ? w : w.to(dtype);
}

std::shared_ptr<const QuantizedWeight> concat_quantized(const std::vector<std::shared_ptr<const QuantizedWeight>>& parts) {
  auto out = std::make_shared<QuantizedWeight>();
  FLUX_CHECK(!parts.empty(), "concat_quantized of no weight");
  out->in_features = parts.front()->in_features;
  for (const auto& p : parts) {
    FLUX_CHECK(p->in_features == out->in_features, "fused quantized weights of ", p->in_features, " and ",
               out->in_features, " input features");
    out->runs.insert(out->runs.end(), p->runs.begin(), p->runs.end());
  }
  return out;
}

at::Tensor quantized_linear(const at::Tensor& x, const QuantizedWeight& w, const at::Tensor& bias) {
  const int64_t K = w.in_features, N = w.out_features();
  TORCH_CHECK(x.size(-1) == K, "quantized linear: input features ", x.size(-1), " against a weight [", N, ", ", K, "]");
  const at::ScalarType dtype = x.scalar_type();
  if (!x.device().is_cpu() || !panels_on) {
    const at::Tensor weight = w.dequantize(dtype).to(x.device());
    return at::linear(x, weight, bias.defined() ? bias.to(dtype) : bias);
  }
  const at::Tensor a = x.reshape({-1, K});
  const int64_t M = a.size(0);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  at::Tensor out = at::empty({M, N}, x.options());
  const int64_t panel = panel_rows(N, K);
  at::Tensor buffer = at::empty({std::min(panel, N), K}, buffer_dtype(dtype));
  for (int64_t r0 = 0; r0 < N; r0 += panel) {
    const int64_t n = std::min(panel, N - r0);
    at::Tensor rows = buffer.narrow(0, 0, n);
    dequantize_into(w, r0, rows);
    if (rows.scalar_type() != dtype) rows = rows.to(dtype);
    const at::Tensor b = bias.defined() ? bias.narrow(0, r0, n).to(dtype) : at::Tensor();
    out.narrow(1, r0, n).copy_(at::linear(a, rows, b));
  }
  return out.view(shape);
}

void set_quantized_panels(bool on) { panels_on = on; }

}  // namespace fluxmpi::nn
