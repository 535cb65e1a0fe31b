#include "text/tokenizer_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fluxmpi::text {
namespace fs = std::filesystem;

std::string TokenizerDir::file_path(const std::string& name) const { return (fs::path(path) / name).string(); }

std::string TokenizerDir::file_label(const std::string& name) const { return str_cat(label, "/", name); }

bool TokenizerDir::has(const std::string& name) const {
  std::error_code ec;
  return fs::exists(file_path(name), ec);
}

std::string require_tokenizer_file(const TokenizerDir& dir, const std::string& name) {
  const std::string p = dir.file_path(name);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw TokenizerError(str_cat(dir.file_label(name), ": file not found"));
  if (fs::is_directory(p, ec)) throw TokenizerError(str_cat(dir.file_label(name), ": is a directory, expected a file"));
  return p;
}

std::string read_tokenizer_file(const TokenizerDir& dir, const std::string& name) {
  const std::string p = require_tokenizer_file(dir, name);
  std::ifstream in(p, std::ios::binary);
  if (!in) throw TokenizerError(str_cat(dir.file_label(name), ": cannot be read (permission denied?)"));
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw TokenizerError(str_cat(dir.file_label(name), ": read error"));
  return os.str();
}

JsonFile read_json_object(const TokenizerDir& dir, const std::string& name) {
  JsonFile f{dir.file_label(name), {}};
  const std::string text = read_tokenizer_file(dir, name);
  try {
    f.json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError(str_cat(f.label, ": not valid JSON (truncated or corrupt?): ", e.what()));
  }
  if (!f.json.is_object()) throw TokenizerError(str_cat(f.label, ": not a JSON object"));
  return f;
}

std::optional<std::string> special_token(const JsonFile& file, const std::string& key) {
  auto it = file.json.find(key);
  if (it == file.json.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  throw TokenizerError(str_cat(file.label, ": '", key, "' must be a string or an object with a string \"content\", got ",
                               it->dump()));
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError(str_cat("cannot create '", path, "'"));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) throw IoError(str_cat("cannot write '", path, "' (disk full?)"));
}

}  // namespace fluxmpi::text
