#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {
namespace {

struct DTypeInfo {
  const char* name;
  DType dtype;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {"BOOL", DType::Bool, 1}, {"U8", DType::U8, 1},     {"I8", DType::I8, 1},
    {"I16", DType::I16, 2},   {"U16", DType::U16, 2},   {"I32", DType::I32, 4},
    {"U32", DType::U32, 4},   {"I64", DType::I64, 8},   {"U64", DType::U64, 8},
    {"F16", DType::F16, 2},   {"BF16", DType::BF16, 2}, {"F32", DType::F32, 4},
    {"F64", DType::F64, 8},   {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
};

// GGUF's block quantizations (ggml's block sizes): never a safetensors dtype name.
struct BlockInfo {
  const char* name;
  DType dtype;
  uint64_t elements, bytes;
};

constexpr BlockInfo kBlockTypes[] = {
    {"Q4_0", DType::Q4_0, 32, 18},   {"Q4_1", DType::Q4_1, 32, 20},   {"Q5_0", DType::Q5_0, 32, 22},
    {"Q5_1", DType::Q5_1, 32, 24},   {"Q8_0", DType::Q8_0, 32, 34},   {"Q2_K", DType::Q2_K, 256, 84},
    {"Q3_K", DType::Q3_K, 256, 110}, {"Q4_K", DType::Q4_K, 256, 144}, {"Q5_K", DType::Q5_K, 256, 176},
    {"Q6_K", DType::Q6_K, 256, 210},
};

const BlockInfo* block_info(DType dtype) {
  for (const auto& b : kBlockTypes)
    if (b.dtype == dtype) return &b;
  return nullptr;
}

const DTypeInfo& info_of(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d;
  if (block_info(dtype) != nullptr)
    throw InternalError(str_cat("dtype ", block_info(dtype)->name, " is block-quantized: it has no element size"));
  throw InternalError("unknown DType");
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

// Reads a JSON value that must be a non-negative integer fitting in uint64.
bool as_u64(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = static_cast<uint64_t>(x);
    return true;
  }
  return false;
}

}  // namespace

std::optional<DType> dtype_from_name(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

const char* dtype_name(DType dtype) {
  if (const BlockInfo* b = block_info(dtype)) return b->name;
  return info_of(dtype).name;
}
size_t dtype_size(DType dtype) { return info_of(dtype).size; }
bool is_quantized(DType dtype) { return block_info(dtype) != nullptr; }
uint64_t block_elements(DType dtype) {
  if (const BlockInfo* b = block_info(dtype)) return b->elements;
  return 1;
}
uint64_t block_bytes(DType dtype) {
  if (const BlockInfo* b = block_info(dtype)) return b->bytes;
  return info_of(dtype).size;
}

uint64_t TensorEntry::num_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // validated not to overflow by the parser
  return n;
}

const TensorEntry* SafetensorsHeader::find(const std::string& name) const {
  // The parser leaves the entries sorted by name.
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorEntry& e, const std::string& n) { return e.name < n; });
  if (it != tensors.end() && it->name == name) return &*it;
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& label) {
  auto fail = [&](const std::string& what) { return WeightError(str_cat("'", label, "': ", what)); };
  if (size < 8) throw fail(str_cat("not a safetensors file: ", size, " bytes, shorter than the 8-byte header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeaderBytes) throw fail(str_cat("header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  if (n > size - 8) throw fail(str_cat("header length ", n, " runs beyond the end of the file (", size, " bytes)"));
  if (n < 2) throw fail(str_cat("header length ", n, " is too short for a JSON object"));

  const char* text = reinterpret_cast<const char*>(bytes + 8);
  // Duplicate top-level names are rejected: nlohmann would silently keep the last one.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json head;
  try {
    head = nlohmann::json::parse(text, text + n, callback);
  } catch (const nlohmann::json::exception& e) {
    throw fail(str_cat("header is not valid JSON: ", e.what()));
  }
  if (!head.is_object()) throw fail("header is not a JSON object");
  if (!duplicate.empty()) throw fail(str_cat("tensor '", duplicate, "' is listed twice in the header"));

  SafetensorsHeader out;
  out.data_offset = 8 + n;
  const uint64_t data_size = size - 8 - n;
  out.tensors.reserve(head.size());
  for (auto it = head.begin(); it != head.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("__metadata__ is not a JSON object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw fail(str_cat("__metadata__ value '", m.key(), "' is not a string"));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return fail(str_cat("tensor '", name, "': ", what)); };
    if (!v.is_object()) throw bad("entry is not a JSON object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) throw bad("missing or non-string 'dtype'");
    if (sh == v.end() || !sh->is_array()) throw bad("missing or non-array 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2) throw bad("'data_offsets' must be an array of two integers");
    TensorEntry e;
    e.name = name;
    auto dtype = dtype_from_name(dt->get<std::string>());
    if (!dtype) throw bad(str_cat("unknown dtype '", dt->get<std::string>(), "'"));
    e.dtype = *dtype;
    uint64_t elements = 1;
    for (const auto& d : *sh) {
      uint64_t dim = 0;
      if (!as_u64(d, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw bad(str_cat("shape entry ", d.dump(), " is not a non-negative integer"));
      if (mul_overflows(elements, dim, &elements)) throw bad("shape product overflows");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    if (mul_overflows(elements, dtype_size(e.dtype), &nbytes)) throw bad("byte size overflows");
    if (!as_u64((*off)[0], &e.begin) || !as_u64((*off)[1], &e.end))
      throw bad("'data_offsets' must be non-negative integers");
    if (e.begin > e.end) throw bad(str_cat("data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
    if (e.end > data_size)
      throw bad(str_cat("data_offsets [", e.begin, ", ", e.end, "] run beyond the data section (", data_size, " bytes)"));
    if (e.end - e.begin != nbytes)
      throw bad(str_cat("shape and dtype need ", nbytes, " bytes but data_offsets [", e.begin, ", ", e.end,
                        "] hold ", e.end - e.begin));
    out.tensors.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: no overlap, no gap, nothing left over.
  std::vector<const TensorEntry*> order;
  order.reserve(out.tensors.size());
  for (const auto& e : out.tensors) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  for (const TensorEntry* e : order) {
    if (e->begin < cursor) throw fail(str_cat("tensor '", e->name, "': data overlaps the previous tensor"));
    if (e->begin > cursor)
      throw fail(str_cat("tensor '", e->name, "': gap in the data section before offset ", e->begin));
    cursor = e->end;
  }
  if (cursor != data_size)
    throw fail(str_cat("tensors cover ", cursor, " bytes of a data section of ", data_size, " bytes"));

  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : WeightFile(path) {
  header_ = parse_safetensors_header(mapping().data(), mapping().size(), path);
}

}  // namespace fluxmpi::io
