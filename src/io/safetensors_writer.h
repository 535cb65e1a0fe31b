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
  /// Total data bytes so far.
  uint64_t data_bytes() const { return data_.size(); }
  /// Writes the file atomically (temporary name + rename). Throws IoError.
  void write(const std::string& path) const;
  /// The whole file as bytes.
  std::vector<uint8_t> serialize() const;
  std::vector<std::string> names() const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Item> items_;
  std::vector<uint8_t> data_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace fluxmpi::io
