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

/// The element types of stored tensors: safetensors' dtypes, and the block quantizations of GGUF
/// files (io/gguf.h), whose tensors store rows of fixed-size blocks rather than elements.
enum class DType {
  Bool, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2,
  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
};

/// "F32" -> DType::F32; nullopt for names safetensors does not define (the GGUF block types included).
std::optional<DType> dtype_from_name(const std::string& name);
/// "F32", "BF16", "Q8_0", "Q4_K", ...
const char* dtype_name(DType dtype);
/// Bytes of one element; InternalError for a block quantization (see block_bytes).
size_t dtype_size(DType dtype);
/// A block quantization: a row of n elements is n / block_elements blocks of block_bytes bytes.
bool is_quantized(DType dtype);
/// Elements per block: 32 (Q4_0 .. Q8_0), 256 (the K-quants), 1 for element types.
uint64_t block_elements(DType dtype);
/// Bytes per block (for element types: the element size).
uint64_t block_bytes(DType dtype);

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

/// A mapped weight file with its validated tensor index: a safetensors file, or a GGUF file
/// (io/gguf.h) whose tensor infos are presented in the same form (torch-order shapes, offsets into
/// the data section). The loader and the key maps of single files read either through this.
class WeightFile {
 public:
  virtual ~WeightFile() = default;
  WeightFile(const WeightFile&) = delete;
  WeightFile& operator=(const WeightFile&) = delete;

  const std::string& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const TensorEntry* find(const std::string& name) const { return header_.find(name); }
  /// Start of the tensor's bytes inside the mapping.
  const uint8_t* data(const TensorEntry& entry) const { return file_.data() + header_.data_offset + entry.begin; }
  /// Drops the mapped pages of a tensor once it has been copied out.
  void release(const TensorEntry& entry) const { file_.release(header_.data_offset + entry.begin, entry.num_bytes()); }
  /// "safetensors" or "GGUF".
  virtual const char* format() const = 0;

 protected:
  explicit WeightFile(const std::string& path) : file_(path) {}
  const MappedFile& mapping() const { return file_; }
  SafetensorsHeader header_;

 private:
  MappedFile file_;
};

/// A mapped safetensors file with its validated header.
class SafetensorsFile : public WeightFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const char* format() const override { return "safetensors"; }
};

/// Whether the file at `path` starts with the GGUF magic ("GGUF"); false for a shorter or
/// unreadable file (the opener then reports it).
bool is_gguf_file(const std::string& path);

/// The weight file at `path`: a GgufFile when it starts with the GGUF magic, else a
/// SafetensorsFile.
std::shared_ptr<WeightFile> open_weight_file(const std::string& path);

}  // namespace fluxmpi::io
