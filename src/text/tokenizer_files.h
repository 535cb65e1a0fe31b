#pragma once
/// Reading the files of a tokenizer folder. Every error is a TokenizerError that names the file
/// through its label ("model dir '/m': tokenizer/vocab.json: ...").

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace fluxmpi::text {

/// A tokenizer folder and the label its files are named by in errors: label "model dir '/m':
/// tokenizer" names vocab.json as "model dir '/m': tokenizer/vocab.json".
struct TokenizerDir {
  std::string path;
  std::string label;
  std::string file_path(const std::string& name) const;
  std::string file_label(const std::string& name) const;
  /// True when `name` exists (as anything: a directory in its place is an error when read).
  bool has(const std::string& name) const;
};

/// The bytes of `name`; TokenizerError when it is missing, a directory, or unreadable.
std::string read_tokenizer_file(const TokenizerDir& dir, const std::string& name);
/// Checks that `name` is an existing regular file and returns its path.
std::string require_tokenizer_file(const TokenizerDir& dir, const std::string& name);

/// A parsed JSON object file (tokenizer_config.json, special_tokens_map.json).
struct JsonFile {
  std::string label;
  nlohmann::json json;
};
/// Reads and parses `name`, which must hold a JSON object.
JsonFile read_json_object(const TokenizerDir& dir, const std::string& name);

/// The content of special token `key` ("eos_token", ...) in `file`: either a plain string or an
/// AddedToken object {"content": "..."}; nullopt when absent or null. Other values throw.
std::optional<std::string> special_token(const JsonFile& file, const std::string& key);

/// Writes `text` to `path` (trainers' output). Throws IoError naming the path.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace fluxmpi::text
