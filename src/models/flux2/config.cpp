#include "models/flux2/config.h"

#include <filesystem>

#include "core/error.h"

namespace fluxmpi::flux2 {

TransformerConfig read_transformer_config(const std::string& transformer_dir) {
  const std::string path = (std::filesystem::path(transformer_dir) / "config.json").string();
  return io::parse_flux2_transformer_config(
      io::ConfigReader::from_file(path, str_cat("transformer folder '", transformer_dir, "': config.json")));
}

}  // namespace fluxmpi::flux2
