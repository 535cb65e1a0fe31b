#include "safetensors_edit.h"

#include <filesystem>
#include <stdexcept>

#include "harness.h"

namespace fluxmpi::reliability {
namespace fs = std::filesystem;

namespace {

uint64_t offset(const nlohmann::ordered_json& entry, int which) {
  return entry.at("data_offsets").at(which).get<uint64_t>();
}

}  // namespace

SafetensorsBytes SafetensorsBytes::read(const std::string& path) {
  const std::string bytes = read_bytes(path);
  if (bytes.size() < 8) throw std::runtime_error("'" + path + "' is not a safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (n > bytes.size() - 8) throw std::runtime_error("'" + path + "' is not a safetensors file");
  SafetensorsBytes out;
  out.header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  out.data = bytes.substr(8 + n);
  return out;
}

std::string SafetensorsBytes::serialize(const std::string& header_text, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header_text + data;
}

void SafetensorsBytes::write_raw(const std::string& path, const std::string& header_text, const std::string& data) {
  write_bytes(path, serialize(header_text, data));
}

std::vector<std::string> SafetensorsBytes::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : header.items())
    if (name != "__metadata__") out.push_back(name);
  return out;
}

std::string SafetensorsBytes::bytes(const std::string& name) const {
  const auto& e = header.at(name);
  return data.substr(offset(e, 0), offset(e, 1) - offset(e, 0));
}

void SafetensorsBytes::remove(const std::string& name) {
  const uint64_t begin = offset(header.at(name), 0), end = offset(header.at(name), 1);
  data.erase(begin, end - begin);
  header.erase(name);
  for (auto& [other, entry] : header.items()) {
    if (other == "__metadata__" || offset(entry, 0) < end) continue;
    entry["data_offsets"] = {offset(entry, 0) - (end - begin), offset(entry, 1) - (end - begin)};
  }
}

void SafetensorsBytes::append(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                              const std::string& bytes) {
  header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
  data += bytes;
}

std::string index_of(const std::string& component_dir) {
  for (const auto& e : fs::directory_iterator(component_dir)) {
    const std::string n = e.path().filename().string();
    const std::string suffix = ".safetensors.index.json";
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      return e.path().string();
  }
  throw std::runtime_error("no *.safetensors.index.json in '" + component_dir + "'");
}

std::string shard_of(const std::string& component_dir, const std::string& key) {
  const nlohmann::ordered_json index = read_json(index_of(component_dir));
  return index.at("weight_map").at(key).get<std::string>();
}

}  // namespace fluxmpi::reliability
