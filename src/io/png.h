#pragma once
/// PNG files through libpng: RGB8 images with tEXt/iTXt metadata, written atomically.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fluxmpi::io {

struct RgbImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;  ///< height * width * 3, row-major RGB
};

/// Writes `image` to `path` through a temporary file in the same directory that is renamed into
/// place, so a killed process never leaves a half-written PNG. `text` entries become iTXt chunks
/// (UTF-8). Throws IoError naming the path on failure.
void write_png(const std::string& path, const RgbImage& image,
               const std::vector<std::pair<std::string, std::string>>& text = {});

/// Reads an 8-bit RGB or RGBA PNG (alpha dropped). Throws IoError naming the path.
RgbImage read_png(const std::string& path, std::vector<std::pair<std::string, std::string>>* text = nullptr);

}  // namespace fluxmpi::io
