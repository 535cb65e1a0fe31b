#pragma once
// Taking a safetensors file apart and writing it back broken in exactly one way, for the rows
// of the bad-input table. Torch-free: bytes and JSON only.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi::reliability {

/// A safetensors file as its two parts: the JSON header (entries in file order) and the data
/// section. write() serialises whatever the header says, checked or not.
struct SafetensorsBytes {
  nlohmann::ordered_json header;
  std::string data;

  /// Reads a well-formed file (the fixtures').
  static SafetensorsBytes read(const std::string& path);
  /// The 8-byte little-endian length, `header_text` as given, then `data`.
  static std::string serialize(const std::string& header_text, const std::string& data);
  static void write_raw(const std::string& path, const std::string& header_text, const std::string& data);
  void write(const std::string& path) const { write_raw(path, header.dump(), data); }

  /// Tensor names in header order (without __metadata__).
  std::vector<std::string> names() const;
  /// The tensor's bytes.
  std::string bytes(const std::string& name) const;
  /// Removes a tensor and its bytes; the tensors after it move down, so the file stays valid.
  void remove(const std::string& name);
  /// Appends a tensor after the last one (valid as long as `bytes` fits dtype and shape).
  void append(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
              const std::string& bytes);
};

/// The shard file name that the index of a sharded component folder assigns `key` to.
std::string shard_of(const std::string& component_dir, const std::string& key);
/// The index file of a sharded component folder (diffusion_pytorch_model.safetensors.index.json).
std::string index_of(const std::string& component_dir);

}  // namespace fluxmpi::reliability
