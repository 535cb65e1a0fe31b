#pragma once
/// safetensors format: 8-byte little-endian header length N, N bytes of JSON header, then the
/// tensor data. This parser does not depend on libtorch so that it can be fuzzed on its own.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/mapped_file.h"

namespace fluxmpi::io {

enum class DType { Bool, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2 };

/// "F32" -> DType::F32; nullopt for names the format does not define.
std::optional<DType> dtype_from_name(const std::string& name);
const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< offset into the data section
  uint64_t end = 0;

  uint64_t num_elements() const;
  uint64_t num_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  ///< sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  ///< 8 + N: where the data section starts in the file

  const TensorEntry* find(const std::string& name) const;
};

/// Largest header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

/// Parses and validates the header of a safetensors file held in `bytes[0, size)` (the whole
/// file). `label` names the file in error messages. Throws WeightError on any malformation:
/// truncated length, header length beyond the file or above kMaxHeaderBytes, JSON that is not an
/// object, duplicate names, unknown dtype, ill-typed fields, shape products that overflow or do
/// not match the byte size, offsets out of range, overlapping or not covering the data section.
/// Nothing is allocated in proportion to declared sizes before they are checked.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& label);

/// A mapped safetensors file with its validated header.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const TensorEntry* find(const std::string& name) const { return header_.find(name); }
  /// Start of the tensor's bytes inside the mapping.
  const uint8_t* data(const TensorEntry& entry) const { return file_.data() + header_.data_offset + entry.begin; }
  /// Drops the mapped pages of a tensor once it has been copied out.
  void release(const TensorEntry& entry) const { file_.release(header_.data_offset + entry.begin, entry.num_bytes()); }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

}  // namespace fluxmpi::io
