#pragma once
/// GGUF files (the format of llama.cpp / ggml, and of the quantized FLUX transformers that
/// city96's ComfyUI-GGUF conversions share): magic "GGUF", a version (2 or 3), the tensor and
/// metadata counts, the metadata key/value pairs, the tensor infos (name, dims innermost first,
/// ggml type, offset), padding to the alignment (`general.alignment`, default 32), then the
/// tensor data. All integers little-endian. The parser does not depend on libtorch, so that it
/// can be fuzzed on its own, and checks every length, count, offset and size against the file
/// before it allocates anything in proportion to them.
///
/// A tensor is presented as safetensors tensors are (io/safetensors.h): its shape in torch order
/// (ggml's ne reversed: a weight [out, in] has ne = {in, out}) and its byte range in the data
/// section. A quantized tensor stores each row (its innermost dim) as whole blocks: rows are
/// independent byte runs, which is what lets a fused tensor be cut into the rows of its parts.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace fluxmpi::io {

/// ggml's type ids as GGUF stores them (ggml.h's enum ggml_type).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

/// "Q4_K" for a type id ggml defines, "type 99" otherwise.
std::string ggml_type_name(uint32_t type);

/// The fluxmpi dtype a ggml type loads as; false for the types fluxmpi does not read (the
/// i-quants, Q8_1, Q8_K, integer types, ...).
bool dtype_of_ggml_type(uint32_t type, DType* out);

/// The ggml types fluxmpi reads, for messages: "F32, F16, BF16, Q8_0, ...".
std::string supported_ggml_types();

/// One metadata value. Scalars keep their value (integers in `integer` / `unsigned_integer`,
/// floats in `real`, booleans as 0/1 integers, strings in `text`); arrays keep their element type
/// and length (their contents are checked and skipped).
struct GgufValue {
  enum Type : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9, U64 = 10,
    I64 = 11, F64 = 12,
  };
  Type type = U8;
  int64_t integer = 0;
  uint64_t unsigned_integer = 0;
  double real = 0;
  std::string text;
  Type array_type = U8;   ///< arrays only
  uint64_t array_size = 0;

  bool is_integer() const;
  /// A printable form: the number, the string, "[N x type]".
  std::string describe() const;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;
  std::vector<uint64_t> ne;  ///< ggml order: ne[0] the innermost (contiguous) dim
  uint64_t offset = 0;       ///< into the data section
  uint64_t bytes = 0;
};

struct GgufHeader {
  uint32_t version = 0;
  uint64_t alignment = 32;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;  ///< in file order
  /// The tensors as an index (torch-order shapes, dtypes, byte ranges), sorted by name, with
  /// data_offset where the data section starts in the file.
  SafetensorsHeader index;

  /// A metadata string, or `fallback` when the key is absent or not a string.
  std::string string(const std::string& key, const std::string& fallback = "") const;
};

/// Largest count of tensors or metadata pairs accepted (far above any model's).
inline constexpr uint64_t kGgufMaxCount = 1u << 20;
/// Largest tensor name and metadata key accepted, in bytes.
inline constexpr uint64_t kGgufMaxName = 4096;

/// Parses and validates the header of a GGUF file held in `bytes[0, size)` (the whole file).
/// `label` names the file in messages. Throws WeightError, naming the file and, where one is
/// concerned, the tensor or key, on: a short file, a bad magic, a version other than 2 or 3,
/// counts beyond the file or kGgufMaxCount, strings or arrays that run past the end, an unknown
/// metadata value type, an alignment that is not a power of two, a tensor with more than 4 dims,
/// a dim product that overflows, a type fluxmpi does not read, a row that is not whole blocks,
/// an offset not aligned or running past the end of the file, overlapping tensors, a name given
/// twice.
GgufHeader parse_gguf_header(const uint8_t* bytes, size_t size, const std::string& label);

/// A mapped GGUF file with its validated header.
class GgufFile : public WeightFile {
 public:
  explicit GgufFile(const std::string& path);
  const char* format() const override { return "GGUF"; }
  const GgufHeader& gguf() const { return gguf_; }

 private:
  GgufHeader gguf_;
};

/// How many tensors of each stored dtype a file holds, largest count first: "F32 x 471, Q8_0 x 304, F16 x 5".
std::string describe_dtypes(const SafetensorsHeader& index);

}  // namespace fluxmpi::io
