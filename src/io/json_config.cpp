#include "io/json_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {
namespace fs = std::filesystem;

struct ConfigReader::Impl {
  nlohmann::json json;
};

std::string read_file(const std::string& path, const std::string& label) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ConfigError(str_cat(label, ": file not found"));
  if (fs::is_directory(path, ec)) throw ConfigError(str_cat(label, ": is a directory, expected a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(str_cat(label, ": cannot be read (permission denied?)"));
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw ConfigError(str_cat(label, ": read error"));
  return os.str();
}

ConfigReader::ConfigReader(std::string text, std::string label)
    : text_(std::move(text)), label_(std::move(label)), impl_(std::make_unique<Impl>()) {
  try {
    impl_->json = nlohmann::json::parse(text_);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str_cat(label_, ": not valid JSON: ", e.what()));
  }
  if (!impl_->json.is_object()) throw ConfigError(str_cat(label_, ": not a JSON object"));
}

ConfigReader::ConfigReader(const ConfigReader& other)
    : text_(other.text_), label_(other.label_), impl_(std::make_unique<Impl>(*other.impl_)) {}
ConfigReader::ConfigReader(ConfigReader&&) noexcept = default;
ConfigReader::~ConfigReader() = default;

ConfigReader ConfigReader::from_file(const std::string& path, const std::string& label) {
  return ConfigReader(read_file(path, label), label);
}

ConfigReader ConfigReader::from_text(const std::string& text, const std::string& label) {
  return ConfigReader(text, label);
}

const nlohmann::json& ConfigReader::json() const { return impl_->json; }

const nlohmann::json* ConfigReader::get(const std::string& key) const {
  auto it = impl_->json.find(key);
  if (it == impl_->json.end() || it->is_null()) return nullptr;
  return &*it;
}

bool ConfigReader::has(const std::string& key) const { return get(key) != nullptr; }

void ConfigReader::fail(const std::string& key, const std::string& problem) const {
  throw ConfigError(str_cat(label_, ": '", key, "' ", problem));
}

int64_t ConfigReader::integer(const std::string& key, int64_t fallback, int64_t min_value) const {
  const nlohmann::json* v = get(key);
  if (v == nullptr) return fallback;
  const char* what = min_value == 1 ? "a positive integer" : min_value == 0 ? "a non-negative integer" : "an integer";
  if (!v->is_number_integer()) fail(key, str_cat("must be ", what, ", got ", v->dump()));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(key, str_cat("is too large: ", v->dump()));
  int64_t x = v->get<int64_t>();
  if (x < min_value) fail(key, str_cat("must be ", what, ", got ", v->dump()));
  return x;
}

double ConfigReader::number(const std::string& key, double fallback) const {
  const nlohmann::json* v = get(key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) fail(key, str_cat("must be a number, got ", v->dump()));
  double x = v->get<double>();
  if (!std::isfinite(x)) fail(key, str_cat("must be finite, got ", v->dump()));
  return x;
}

double ConfigReader::positive_number(const std::string& key, double fallback) const {
  double x = number(key, fallback);
  if (!(x > 0)) fail(key, str_cat("must be a positive number, got ", get(key) ? get(key)->dump() : std::to_string(x)));
  return x;
}

std::optional<double> ConfigReader::optional_number(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return number(key, 0.0);
}

bool ConfigReader::boolean(const std::string& key, bool fallback) const {
  const nlohmann::json* v = get(key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) fail(key, str_cat("must be true or false, got ", v->dump()));
  return v->get<bool>();
}

std::string ConfigReader::string(const std::string& key, const std::string& fallback) const {
  const nlohmann::json* v = get(key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) fail(key, str_cat("must be a string, got ", v->dump()));
  return v->get<std::string>();
}

std::optional<std::string> ConfigReader::optional_string(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return string(key, "");
}

std::vector<int64_t> ConfigReader::integer_list(const std::string& key, const std::vector<int64_t>& fallback,
                                                int64_t min_value) const {
  const nlohmann::json* v = get(key);
  if (v == nullptr) return fallback;
  if (!v->is_array()) fail(key, str_cat("must be a list of integers, got ", v->dump()));
  std::vector<int64_t> out;
  for (const auto& x : *v) {
    if (!x.is_number_integer() || x.get<int64_t>() < min_value)
      fail(key, str_cat("must be a list of integers >= ", min_value, ", got ", v->dump()));
    out.push_back(x.get<int64_t>());
  }
  return out;
}

std::vector<std::string> ConfigReader::string_list(const std::string& key, const std::vector<std::string>& fallback) const {
  const nlohmann::json* v = get(key);
  if (v == nullptr) return fallback;
  if (!v->is_array()) fail(key, str_cat("must be a list of strings, got ", v->dump()));
  std::vector<std::string> out;
  for (const auto& x : *v) {
    if (!x.is_string()) fail(key, str_cat("must be a list of strings, got ", v->dump()));
    out.push_back(x.get<std::string>());
  }
  return out;
}

}  // namespace fluxmpi::io
