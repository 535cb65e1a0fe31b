#pragma once
/// Input images (PNG, JPEG, WebP) decoded to 8-bit RGB exactly as diffusers.utils.load_image does
/// with Pillow 9.4: open, ImageOps.exif_transpose, convert('RGB'). docs/images.md lists the modes
/// and how each converts.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi::io {

/// An 8-bit image, rows top to bottom, `channels` interleaved samples per pixel.
struct Image8 {
  int width = 0;
  int height = 0;
  int channels = 0;             ///< 3 = RGB, 1 = L (grey)
  std::vector<uint8_t> pixels;  ///< height * width * channels

  uint8_t at(int y, int x, int c = 0) const {
    return pixels[(static_cast<size_t>(y) * width + x) * channels + c];
  }
};

/// Largest input accepted: per side, in pixels, and in file bytes. A decoded image beyond these is
/// refused before its pixels are allocated.
inline constexpr int kMaxImageSide = 16384;
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;
inline constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 30;

/// Reads a PNG, JPEG or WebP file (the format is told by its first bytes, not its name) and returns
/// it as RGB (channels 3), as load_image would: EXIF orientation applied, alpha dropped (not
/// composited), grey replicated, palette looked up, 16-bit samples reduced as Pillow does.
/// Throws "'<path>': <what is wrong>": UsageError for a path that names no file (or a folder),
/// ImageError for an empty, truncated, oversized or undecodable file, IoError when an existing
/// file cannot be read.
Image8 read_image(const std::string& path);

/// The same from bytes in memory; `label` names the source in error messages.
Image8 decode_image(const uint8_t* data, size_t size, const std::string& label);

/// Pillow's convert('L') of an RGB image: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16. A grey
/// image is returned unchanged.
Image8 to_grey(const Image8& image);

/// The inpaint mask binarisation of diffusers (float32(grey) / 255 >= 0.5 -> 1, else 0) on the
/// 8-bit grey mask: 1 where grey >= 128. Returns a one-channel image of 0 and 1.
Image8 binarize_mask(const Image8& grey);

}  // namespace fluxmpi::io
