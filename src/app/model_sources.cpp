#include "app/model_sources.h"

#include <unistd.h>

#include <filesystem>

namespace fluxmpi::app {
namespace fs = std::filesystem;

std::string shipped_models_dir() {
  std::error_code ec;
  std::string installed;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = '\0';
    installed = (fs::path(buf).parent_path().parent_path() / "share" / "fluxmpi" / "models").lexically_normal().string();
    if (fs::is_directory(installed, ec)) return installed;
  }
  const std::string source = (fs::path(FLUXMPI_SOURCE_SHARE_DIR) / "models").string();
  if (fs::is_directory(source, ec)) return source;
  return installed.empty() ? source : installed;
}

io::ModelSources model_sources_of(const RunConfig& c) {
  io::ModelSources s;
  s.model = c.model;
  s.transformer = c.transformer;
  s.vae = c.vae;
  s.text_encoder = c.text_encoder;
  s.text_encoder_2 = c.text_encoder_2;
  s.model_config = c.model_config;
  s.shipped_models = shipped_models_dir();
  return s;
}

}  // namespace fluxmpi::app
