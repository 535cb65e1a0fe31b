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
  items_.push_back(Item{name, dtype, shape, data_end_, data_end_ + size, false});
  data_.insert(data_.end(), static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + size);
  data_end_ += size;
}

void SafetensorsWriter::add_hollow(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  const uint64_t size = n * dtype_size(dtype);
  items_.push_back(Item{name, dtype, shape, data_end_, data_end_ + size, true});
  data_end_ += size;
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const auto& i : items_) out.push_back(i.name);
  return out;
}

std::string SafetensorsWriter::header_text() const {
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
  return text;
}

std::vector<uint8_t> SafetensorsWriter::serialize() const {
  for (const auto& i : items_) FLUX_CHECK(!i.hollow, "serialize(): tensor '", i.name, "' is hollow; use write()");
  const std::string text = header_text();
  std::vector<uint8_t> out(8 + text.size() + data_.size());
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  if (!data_.empty()) std::memcpy(out.data() + 8 + text.size(), data_.data(), data_.size());
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string text = header_text();
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(str_cat("cannot write '", path, "'"));
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    // Stored tensors are written in place; hollow ones are skipped over, leaving a hole.
    const std::streamoff data_start = static_cast<std::streamoff>(8 + text.size());
    uint64_t stored = 0;
    for (const auto& i : items_) {
      if (i.hollow) continue;
      out.seekp(data_start + static_cast<std::streamoff>(i.begin));
      out.write(reinterpret_cast<const char*>(data_.data() + stored), static_cast<std::streamsize>(i.end - i.begin));
      stored += i.end - i.begin;
    }
    out.close();
    std::error_code size_ec;
    if (out) std::filesystem::resize_file(tmp, static_cast<uintmax_t>(data_start) + data_end_, size_ec);
    if (!out || size_ec) {
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
