#include "models/common/tensor_utils.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "io/dequantize.h"
#include "io/float8.h"

namespace fluxmpi::nn {

at::ScalarType parse_dtype(const std::string& text) {
  if (text == "fp32" || text == "float32") return at::kFloat;
  if (text == "bf16" || text == "bfloat16") return at::kBFloat16;
  if (text == "fp16" || text == "float16") return at::kHalf;
  throw UsageError(str_cat("--dtype must be fp32, bf16 or fp16, got '", text, "'"));
}

const char* dtype_label(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return "other";
  }
}

bool dtype_supported(at::ScalarType dtype, at::Device device) {
  try {
    at::Tensor a = at::ones({2, 2}, at::TensorOptions().dtype(dtype).device(device));
    at::Tensor b = at::linear(a, a, a.select(0, 0));
    return b.scalar_type() == dtype;
  } catch (const c10::Error&) {
    return false;
  }
}

bool cpu_conv_sums_in_fp32(at::ScalarType dtype) {
  if (dtype == at::kFloat || dtype == at::kDouble) return true;
  const bool onednn = at::globalContext().userEnabledMkldnn();
  static std::mutex mutex;
  static std::map<std::pair<int, bool>, bool> probed;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(static_cast<int>(dtype), onednn);
  auto it = probed.find(key);
  if (it != probed.end()) return it->second;
  bool exact = false;
  try {
    // 4096 products of 1: a running total kept in bf16 stops growing at 256, in fp16 at 2048.
    at::Tensor ones = at::ones({1, 4096, 1, 1}, at::TensorOptions().dtype(dtype));
    exact = at::conv2d(ones, ones).item<double>() == 4096.0;
  } catch (const c10::Error&) {
    exact = false;  // no kernel at all for this dtype: the fp32 route is the only one
  }
  probed.emplace(key, exact);
  return exact;
}

namespace {
at::ScalarType scalar_type_of(io::DType d, const std::string& key, const std::string& file) {
  switch (d) {
    case io::DType::F32: return at::kFloat;
    case io::DType::F16: return at::kHalf;
    case io::DType::BF16: return at::kBFloat16;
    case io::DType::F64: return at::kDouble;
    case io::DType::I64: return at::kLong;
    case io::DType::I32: return at::kInt;
    case io::DType::I16: return at::kShort;
    case io::DType::I8: return at::kChar;
    case io::DType::U8: return at::kByte;
    case io::DType::Bool: return at::kBool;
    default:
      throw WeightError(str_cat("'", file, "': tensor '", key, "' has dtype ", io::dtype_name(d),
                                ", which fluxmpi cannot load (supported: F32, F16, BF16, F8_E4M3, F8_E5M2, F64 and integer types)"));
  }
}
}  // namespace

at::Tensor borrow(const io::TensorView& view) {
  const io::TensorEntry& e = *view.entry;
  at::ScalarType st = scalar_type_of(e.dtype, e.name, view.file->path());
  std::vector<int64_t> shape(e.shape.begin(), e.shape.end());
  const uint8_t* ptr = view.data();
  size_t elem = io::dtype_size(e.dtype);
  if (e.num_bytes() == 0) return at::empty(shape, at::TensorOptions().dtype(st));
  if (reinterpret_cast<uintptr_t>(ptr) % elem == 0) {
    // The mapping is read-only; nothing writes through this tensor (it is only a copy source).
    return at::from_blob(const_cast<uint8_t*>(ptr), shape, at::TensorOptions().dtype(st));
  }
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(st));
  std::memcpy(out.data_ptr(), ptr, e.num_bytes());
  return out;
}

namespace {

// The mapped bytes of one piece as a tensor of its shape, in its stored dtype.
at::Tensor borrow_bytes(const uint8_t* ptr, uint64_t bytes, const std::vector<int64_t>& shape, io::DType dtype,
                        const std::string& key, const std::string& file) {
  at::ScalarType st = scalar_type_of(dtype, key, file);
  if (bytes == 0) return at::empty(shape, at::TensorOptions().dtype(st));
  if (reinterpret_cast<uintptr_t>(ptr) % io::dtype_size(dtype) == 0)
    return at::from_blob(const_cast<uint8_t*>(ptr), shape, at::TensorOptions().dtype(st));
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(st));
  std::memcpy(out.data_ptr(), ptr, bytes);
  return out;
}

// Float8 and GGUF block-quantized rows decoded a block of rows at a time into float32, so a large
// matrix never needs a float32 copy of itself.
constexpr int64_t kDecodeElements = int64_t{1} << 22;

void copy_decoded_rows(const uint8_t* codes, int64_t rows, int64_t cols, io::DType dtype, at::Tensor dst_rows) {
  const int64_t step = std::max<int64_t>(1, kDecodeElements / std::max<int64_t>(cols, 1));
  const uint64_t row_bytes = io::is_quantized(dtype) ? io::row_bytes(dtype, cols) : static_cast<uint64_t>(cols);
  at::Tensor buffer = at::empty({std::min(step, rows), cols}, at::kFloat);
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t n = std::min(step, rows - r);
    at::Tensor block = buffer.narrow(0, 0, n);
    const uint8_t* src = codes + static_cast<uint64_t>(r) * row_bytes;
    float* out = block.data_ptr<float>();
    if (io::is_quantized(dtype)) io::dequantize_rows(dtype, src, n, cols, out, cols);
    else if (dtype == io::DType::F8_E4M3) io::decode_f8_e4m3(src, static_cast<size_t>(n * cols), out);
    else io::decode_f8_e5m2(src, static_cast<size_t>(n * cols), out);
    dst_rows.narrow(0, r, n).copy_(block);
  }
}

}  // namespace

void copy_view(const io::TensorView& view, at::Tensor& dst) {
  FLUX_CHECK(dst.is_contiguous(), "copy_view needs a contiguous destination");
  if (dst.numel() == 0) return;
  int64_t rows = 0;
  for (const auto& p : view.pieces) rows += p.row_end - p.row_begin;
  at::Tensor flat = dst.view({rows, -1});
  int64_t at = 0;
  for (const auto& p : view.pieces) {
    const int64_t n = p.row_end - p.row_begin;
    at::Tensor target = flat.narrow(0, at, n);
    const io::DType d = p.entry->dtype;
    if (d == io::DType::F8_E4M3 || d == io::DType::F8_E5M2 || io::is_quantized(d)) {
      copy_decoded_rows(p.data(), n, flat.size(1), d, target);
    } else {
      at::Tensor src = borrow_bytes(p.data(), p.num_bytes(), p.shape(), d, p.entry->name, p.file->path());
      target.copy_(src.reshape({n, -1}));
    }
    at += n;
  }
}

at::Tensor read_tensor(const io::TensorStore& store, const std::string& key, at::ScalarType dtype, at::Device device) {
  io::TensorView view = store.get(key);
  at::Tensor out = at::empty(view.entry->shape, at::TensorOptions().dtype(dtype).device(device));
  copy_view(view, out);
  view.release();
  return out;
}

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string shape_string(const std::vector<int64_t>& shape) { return shape_string(at::IntArrayRef(shape)); }

void check_shape(const at::Tensor& t, const std::vector<int64_t>& expected, const char* what) {
  bool ok = t.dim() == static_cast<int64_t>(expected.size());
  for (size_t i = 0; ok && i < expected.size(); ++i)
    if (expected[i] >= 0 && t.size(static_cast<int64_t>(i)) != expected[i]) ok = false;
  if (!ok) {
    std::string want = "[";
    for (size_t i = 0; i < expected.size(); ++i)
      want += (i ? ", " : "") + (expected[i] >= 0 ? std::to_string(expected[i]) : std::string("*"));
    throw InternalError(str_cat(what, ": expected shape ", want, "], got ", shape_string(t.sizes())));
  }
}

}  // namespace fluxmpi::nn
