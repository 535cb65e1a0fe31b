#pragma once
/// Typed reading of JSON config files (config.json, model_index.json, tokenizer configs). Every
/// error names the file (through the label) and the key: `model dir '/m': transformer/config.json:
/// 'num_layers' must be a positive integer, got "19"`. Keys that are absent or null take the
/// default given by the caller (diffusers' defaults); unknown keys are ignored.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fluxmpi::io {

class ConfigReader {
 public:
  /// Reads and parses `path`; throws ConfigError (missing file, directory, not JSON, not an object).
  static ConfigReader from_file(const std::string& path, const std::string& label);
  static ConfigReader from_text(const std::string& text, const std::string& label);
  ConfigReader(const ConfigReader&);
  ConfigReader(ConfigReader&&) noexcept;
  ~ConfigReader();

  const std::string& label() const { return label_; }
  const std::string& text() const { return text_; }
  /// Present and not null.
  bool has(const std::string& key) const;

  int64_t integer(const std::string& key, int64_t fallback, int64_t min_value) const;
  int64_t positive(const std::string& key, int64_t fallback) const { return integer(key, fallback, 1); }
  double number(const std::string& key, double fallback) const;
  /// A number that must be > 0.
  double positive_number(const std::string& key, double fallback) const;
  std::optional<double> optional_number(const std::string& key) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  std::optional<std::string> optional_string(const std::string& key) const;
  /// A list of integers >= min_value.
  std::vector<int64_t> integer_list(const std::string& key, const std::vector<int64_t>& fallback, int64_t min_value) const;
  std::vector<std::string> string_list(const std::string& key, const std::vector<std::string>& fallback) const;
  /// Throws ConfigError "<label>: '<key>' <problem>".
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;
  const nlohmann::json& json() const;

 private:
  ConfigReader(std::string text, std::string label);
  const nlohmann::json* get(const std::string& key) const;
  std::string text_;
  std::string label_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Reads a whole file into memory (configs, vocab files). Throws `ConfigError` naming `label` when
/// the file is missing, is a directory or cannot be read.
std::string read_file(const std::string& path, const std::string& label);

}  // namespace fluxmpi::io
