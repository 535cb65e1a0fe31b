#include "io/safetensors_writer.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* bytes,
                            size_t size) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  FLUX_CHECK(n * dtype_size(dtype) == size, "tensor '", name, "': ", size, " bytes for ", n, " elements");
  Item item{name, dtype, shape, data_.size(), data_.size() + size};
  data_.insert(data_.end(), static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + size);
  items_.push_back(std::move(item));
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const auto& i : items_) out.push_back(i.name);
  return out;
}

std::vector<uint8_t> SafetensorsWriter::serialize() const {
  nlohmann::ordered_json head = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& kv : metadata_) meta[kv.first] = kv.second;
    head["__metadata__"] = meta;
  }
  for (const auto& i : items_) {
    head[i.name] = {{"dtype", dtype_name(i.dtype)}, {"shape", i.shape}, {"data_offsets", {i.begin, i.end}}};
  }
  std::string text = head.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8 + text.size() + data_.size());
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  if (!data_.empty()) std::memcpy(out.data() + 8 + text.size(), data_.data(), data_.size());
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<uint8_t> bytes = serialize();
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(str_cat("cannot write '", path, "'"));
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::remove(tmp.c_str());
      throw IoError(str_cat("cannot write '", path, "': write failed"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw IoError(str_cat("cannot write '", path, "': ", ec.message()));
  }
}

}  // namespace fluxmpi::io
