#include "app/paths.h"

#include <unistd.h>

#include <filesystem>

#include "core/error.h"

namespace fluxmpi::app {
namespace fs = std::filesystem;

std::string parent_directory(const std::string& file) {
  fs::path parent = fs::path(file).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void require_writable_parent(const std::string& file, const std::string& what) {
  const std::string dir = parent_directory(file);
  std::error_code ec;
  const std::string culprit = str_cat(what, " '", file, "': directory '", dir, "'");
  if (!fs::exists(dir, ec)) throw UsageError(str_cat(culprit, " does not exist"));
  if (!fs::is_directory(dir, ec)) throw UsageError(str_cat(culprit, " is not a directory"));
  // Creating a file needs write and search permission on the directory.
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw UsageError(str_cat(culprit, " is not writable"));
}

namespace {
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal();
  fs::path canonical = fs::weakly_canonical(absolute, ec);
  return ec ? absolute.lexically_normal() : canonical;
}
}  // namespace

bool same_file(const std::string& a, const std::string& b) { return resolved(a) == resolved(b); }

}  // namespace fluxmpi::app
