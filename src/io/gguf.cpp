#include "io/gguf.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"

namespace fluxmpi::io {
namespace {

struct TypeInfo {
  GgmlType type;
  const char* name;
  bool readable;  // fluxmpi loads it
  DType dtype;
};

constexpr TypeInfo kTypes[] = {
    {GgmlType::F32, "F32", true, DType::F32},         {GgmlType::F16, "F16", true, DType::F16},
    {GgmlType::BF16, "BF16", true, DType::BF16},      {GgmlType::Q8_0, "Q8_0", true, DType::Q8_0},
    {GgmlType::Q4_0, "Q4_0", true, DType::Q4_0},      {GgmlType::Q4_1, "Q4_1", true, DType::Q4_1},
    {GgmlType::Q5_0, "Q5_0", true, DType::Q5_0},      {GgmlType::Q5_1, "Q5_1", true, DType::Q5_1},
    {GgmlType::Q2_K, "Q2_K", true, DType::Q2_K},      {GgmlType::Q3_K, "Q3_K", true, DType::Q3_K},
    {GgmlType::Q4_K, "Q4_K", true, DType::Q4_K},      {GgmlType::Q5_K, "Q5_K", true, DType::Q5_K},
    {GgmlType::Q6_K, "Q6_K", true, DType::Q6_K},      {GgmlType::Q8_1, "Q8_1", false, DType::U8},
    {GgmlType::Q8_K, "Q8_K", false, DType::U8},       {GgmlType::IQ2_XXS, "IQ2_XXS", false, DType::U8},
    {GgmlType::IQ2_XS, "IQ2_XS", false, DType::U8},   {GgmlType::IQ3_XXS, "IQ3_XXS", false, DType::U8},
    {GgmlType::IQ1_S, "IQ1_S", false, DType::U8},     {GgmlType::IQ4_NL, "IQ4_NL", false, DType::U8},
    {GgmlType::IQ3_S, "IQ3_S", false, DType::U8},     {GgmlType::IQ2_S, "IQ2_S", false, DType::U8},
    {GgmlType::IQ4_XS, "IQ4_XS", false, DType::U8},   {GgmlType::I8, "I8", false, DType::U8},
    {GgmlType::I16, "I16", false, DType::U8},         {GgmlType::I32, "I32", false, DType::U8},
    {GgmlType::I64, "I64", false, DType::U8},         {GgmlType::F64, "F64", false, DType::U8},
    {GgmlType::IQ1_M, "IQ1_M", false, DType::U8},     {GgmlType::TQ1_0, "TQ1_0", false, DType::U8},
    {GgmlType::TQ2_0, "TQ2_0", false, DType::U8},     {GgmlType::MXFP4, "MXFP4", false, DType::U8},
};

const TypeInfo* type_info(uint32_t type) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == type) return &t;
  return nullptr;
}

const char* value_type_name(uint32_t t) {
  static const char* const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64",
                                      "i64", "f64"};
  return t < 13 ? names[t] : "?";
}

// Sizes of the fixed-size metadata value types; 0 for string and array.
uint64_t scalar_size(uint32_t t) {
  switch (t) {
    case GgufValue::U8: case GgufValue::I8: case GgufValue::Bool: return 1;
    case GgufValue::U16: case GgufValue::I16: return 2;
    case GgufValue::U32: case GgufValue::I32: case GgufValue::F32: return 4;
    case GgufValue::U64: case GgufValue::I64: case GgufValue::F64: return 8;
    default: return 0;
  }
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

// A bounds-checked little-endian reader over the file's bytes. Every read names what it reads, so
// a truncated file says where it ends.
class Reader {
 public:
  Reader(const uint8_t* bytes, size_t size, const std::string& label) : p_(bytes), size_(size), label_(label) {}

  [[noreturn]] void fail(const std::string& what) const { throw WeightError(str_cat("'", label_, "': ", what)); }

  uint64_t left() const { return size_ - at_; }
  uint64_t at() const { return at_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      fail(str_cat("truncated: ", what, " needs ", n, " bytes at offset ", at_, " but the file ends after ", left()));
  }
  uint64_t uint(int bytes, const std::string& what) {
    need(static_cast<uint64_t>(bytes), what);
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p_[at_ + static_cast<size_t>(i)];
    at_ += static_cast<size_t>(bytes);
    return v;
  }
  uint32_t u32(const std::string& what) { return static_cast<uint32_t>(uint(4, what)); }
  uint64_t u64(const std::string& what) { return uint(8, what); }
  void skip(uint64_t n, const std::string& what) {
    need(n, what);
    at_ += static_cast<size_t>(n);
  }
  std::string string(uint64_t limit, const std::string& what) {
    const uint64_t n = u64(str_cat(what, "'s length"));
    if (n > limit) fail(str_cat(what, " is ", n, " bytes long, above the limit of ", limit));
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + at_), static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return s;
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t at_ = 0;
  const std::string& label_;
};

// Reads one metadata value of type `type` (arrays: checked and skipped, nested at most 3 deep).
GgufValue read_value(Reader& r, uint32_t type, const std::string& key, int depth) {
  GgufValue v;
  if (type > GgufValue::F64) r.fail(str_cat("metadata '", key, "': unknown value type ", type));
  v.type = static_cast<GgufValue::Type>(type);
  const std::string what = str_cat("metadata '", key, "'");
  switch (v.type) {
    case GgufValue::String: v.text = r.string(r.left(), what); break;
    case GgufValue::Array: {
      const uint32_t element = r.u32(what + "'s element type");
      if (element > GgufValue::F64) r.fail(str_cat(what, ": unknown array element type ", element));
      if (element == GgufValue::Array && depth >= 3) r.fail(str_cat(what, ": arrays nested more than 3 deep"));
      v.array_type = static_cast<GgufValue::Type>(element);
      v.array_size = r.u64(what + "'s array length");
      const uint64_t each = scalar_size(element);
      if (each > 0) {
        uint64_t bytes = 0;
        if (mul_overflows(v.array_size, each, &bytes) || bytes > r.left())
          r.fail(str_cat("truncated: ", what, " is an array of ", v.array_size, " ", value_type_name(element),
                         " but the file ends after ", r.left(), " bytes"));
        r.skip(bytes, what);
      } else {
        // Strings (8-byte length each) and arrays (12-byte head each): the count is bounded by
        // what is left before anything is read.
        const uint64_t least = element == GgufValue::String ? 8 : 12;
        if (v.array_size > r.left() / least)
          r.fail(str_cat("truncated: ", what, " is an array of ", v.array_size, " ", value_type_name(element),
                         " but the file ends after ", r.left(), " bytes"));
        for (uint64_t i = 0; i < v.array_size; ++i) read_value(r, element, key, depth + 1);
      }
      break;
    }
    case GgufValue::F32: {
      const uint32_t bits = r.u32(what);
      float f;
      std::memcpy(&f, &bits, 4);
      v.real = f;
      break;
    }
    case GgufValue::F64: {
      const uint64_t bits = r.u64(what);
      std::memcpy(&v.real, &bits, 8);
      break;
    }
    default: {
      const int n = static_cast<int>(scalar_size(type));
      const uint64_t raw = r.uint(n, what);
      v.unsigned_integer = raw;
      const bool is_signed = type == GgufValue::I8 || type == GgufValue::I16 || type == GgufValue::I32 ||
                             type == GgufValue::I64;
      if (is_signed && n < 8 && (raw >> (8 * n - 1)) != 0) v.integer = static_cast<int64_t>(raw | (~uint64_t{0} << (8 * n)));
      else v.integer = static_cast<int64_t>(raw);
      break;
    }
  }
  return v;
}

std::string dims_text(const std::vector<uint64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  if (const TypeInfo* t = type_info(type)) return t->name;
  return str_cat("type ", type);
}

bool dtype_of_ggml_type(uint32_t type, DType* out) {
  const TypeInfo* t = type_info(type);
  if (t == nullptr || !t->readable) return false;
  *out = t->dtype;
  return true;
}

std::string supported_ggml_types() {
  std::string s;
  for (const auto& t : kTypes)
    if (t.readable) s += str_cat(s.empty() ? "" : ", ", t.name);
  return s;
}

bool GgufValue::is_integer() const {
  return type != F32 && type != F64 && type != String && type != Array;
}

std::string GgufValue::describe() const {
  switch (type) {
    case String: return text;
    case Array: return str_cat("[", array_size, " x ", value_type_name(array_type), "]");
    case F32: case F64: return str_cat(real);
    case U64: return str_cat(unsigned_integer);
    default: return str_cat(integer);
  }
}

std::string GgufHeader::string(const std::string& key, const std::string& fallback) const {
  auto it = metadata.find(key);
  return it != metadata.end() && it->second.type == GgufValue::String ? it->second.text : fallback;
}

GgufHeader parse_gguf_header(const uint8_t* bytes, size_t size, const std::string& label) {
  Reader r(bytes, size, label);
  if (size < 4 || std::memcmp(bytes, "GGUF", 4) != 0)
    r.fail(size < 4 ? str_cat("not a GGUF file: ", size, " bytes, shorter than the magic")
                    : "not a GGUF file: it does not start with the magic \"GGUF\"");
  r.skip(4, "the magic");
  GgufHeader h;
  h.version = r.u32("the version");
  if (h.version != 2 && h.version != 3)
    r.fail(str_cat("GGUF version ", h.version, " is not supported (fluxmpi reads versions 2 and 3)"));
  const uint64_t tensor_count = r.u64("the tensor count");
  const uint64_t kv_count = r.u64("the metadata count");
  // A metadata pair is at least 12 bytes (key length, value type), a tensor info 24 (name length,
  // n_dims, type, offset): counts the file cannot hold are refused before anything is read.
  if (kv_count > kGgufMaxCount || kv_count > r.left() / 12)
    r.fail(str_cat("metadata count ", kv_count, " is more than the file can hold"));
  if (tensor_count > kGgufMaxCount || tensor_count > r.left() / 24)
    r.fail(str_cat("tensor count ", tensor_count, " is more than the file can hold"));

  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = r.string(kGgufMaxName, str_cat("metadata key ", i));
    const uint32_t type = r.u32(str_cat("metadata '", key, "''s value type"));
    GgufValue v = read_value(r, type, key, 0);
    if (!h.metadata.emplace(key, std::move(v)).second) r.fail(str_cat("metadata '", key, "' is given twice"));
  }
  if (auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
    const GgufValue& a = it->second;
    if (!a.is_integer() || a.integer <= 0 || (a.integer & (a.integer - 1)) != 0 || a.integer > (1 << 24))
      r.fail(str_cat("metadata 'general.alignment' must be a power of two up to 2^24, got ", a.describe()));
    h.alignment = static_cast<uint64_t>(a.integer);
  }

  std::set<std::string> names;
  h.tensors.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = r.string(kGgufMaxName, str_cat("the name of tensor ", i));
    const std::string what = str_cat("tensor '", t.name, "'");
    if (!names.insert(t.name).second) r.fail(str_cat(what, " is listed twice"));
    const uint32_t dims = r.u32(what + "'s dimension count");
    if (dims == 0 || dims > 4) r.fail(str_cat(what, " has ", dims, " dimensions (GGUF tensors have 1 to 4)"));
    uint64_t elements = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t n = r.u64(what + "'s dimensions");
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || mul_overflows(elements, n, &elements))
        r.fail(str_cat(what, ": the product of its dimensions overflows"));
      t.ne.push_back(n);
    }
    t.type = r.u32(what + "'s type");
    t.offset = r.u64(what + "'s offset");
    DType dtype{};
    if (!dtype_of_ggml_type(t.type, &dtype))
      r.fail(str_cat(what, " has quantization type ", ggml_type_name(t.type), ", which fluxmpi does not read (it reads ",
                     supported_ggml_types(), ")"));
    const uint64_t block = block_elements(dtype);
    if (t.ne[0] % block != 0)
      r.fail(str_cat(what, " of dims ", dims_text(t.ne), ": its rows of ", t.ne[0], " elements are not whole ",
                     ggml_type_name(t.type), " blocks of ", block));
    if (elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        mul_overflows(elements / block, block_bytes(dtype), &t.bytes))
      r.fail(str_cat(what, ": its byte size overflows"));
    h.tensors.push_back(std::move(t));
  }

  const uint64_t header_end = r.at();
  const uint64_t pad = (h.alignment - header_end % h.alignment) % h.alignment;
  if (pad > r.left())
    r.fail(str_cat("truncated: the data section would start at offset ", header_end + pad, " but the file has ", size,
                   " bytes"));
  h.index.data_offset = header_end + pad;
  const uint64_t data_size = size - h.index.data_offset;
  std::vector<const GgufTensorInfo*> order;
  for (const auto& t : h.tensors) {
    const std::string what = str_cat("tensor '", t.name, "'");
    if (t.offset % h.alignment != 0)
      r.fail(str_cat(what, ": offset ", t.offset, " is not a multiple of the alignment ", h.alignment));
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      r.fail(str_cat(what, " (", ggml_type_name(t.type), ", dims ", dims_text(t.ne), ", ", t.bytes, " bytes at offset ",
                     t.offset, ") runs past the end of the file: the data section holds ", data_size, " bytes"));
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->bytes)
      r.fail(str_cat("tensor '", order[i]->name, "' overlaps tensor '", order[i - 1]->name, "' in the data section"));

  h.index.tensors.reserve(h.tensors.size());
  for (const auto& t : h.tensors) {
    TensorEntry e;
    e.name = t.name;
    dtype_of_ggml_type(t.type, &e.dtype);
    for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it) e.shape.push_back(static_cast<int64_t>(*it));
    e.begin = t.offset;
    e.end = t.offset + t.bytes;
    h.index.tensors.push_back(std::move(e));
  }
  std::sort(h.index.tensors.begin(), h.index.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  for (const auto& [key, value] : h.metadata)
    if (value.type != GgufValue::Array) h.index.metadata[key] = value.describe();
  return h;
}

GgufFile::GgufFile(const std::string& path) : WeightFile(path) {
  gguf_ = parse_gguf_header(mapping().data(), mapping().size(), path);
  header_ = gguf_.index;
}

bool is_gguf_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const ssize_t n = ::read(fd, magic, 4);
  ::close(fd);
  return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

std::shared_ptr<WeightFile> open_weight_file(const std::string& path) {
  if (is_gguf_file(path)) return std::make_shared<GgufFile>(path);
  return std::make_shared<SafetensorsFile>(path);
}

std::string describe_dtypes(const SafetensorsHeader& index) {
  std::map<std::string, int64_t> counts;
  for (const auto& e : index.tensors) counts[dtype_name(e.dtype)] += 1;
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string s;
  for (const auto& [name, n] : sorted) s += str_cat(s.empty() ? "" : ", ", name, " x ", n);
  return s;
}

}  // namespace fluxmpi::io
