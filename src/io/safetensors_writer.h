#pragma once
/// Writes safetensors files (make-tiny-model, tests). Tensors are written in the order added; the
/// header is padded with spaces to a multiple of 8 bytes, as the reference implementation does.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace fluxmpi::io {

class SafetensorsWriter {
 public:
  /// Copies `bytes` (must be num_elements(shape) * dtype_size(dtype) long).
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* bytes, size_t size);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  /// A tensor whose data is a file hole (reads as zeros, takes no disk): "hollow" files with real
  /// names, dtypes and shapes, for tests at real size that read only the headers.
  void add_hollow(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  /// Total data bytes so far (hollow tensors included).
  uint64_t data_bytes() const { return data_end_; }
  /// Writes the file atomically (temporary name + rename). Throws IoError.
  void write(const std::string& path) const;
  /// The whole file as bytes (not for files with hollow tensors).
  std::vector<uint8_t> serialize() const;
  std::vector<std::string> names() const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
    bool hollow = false;
  };
  std::string header_text() const;

  std::vector<Item> items_;
  std::vector<uint8_t> data_;  ///< the bytes of the tensors that are not hollow, in order
  uint64_t data_end_ = 0;
  std::map<std::string, std::string> metadata_;
};

}  // namespace fluxmpi::io
