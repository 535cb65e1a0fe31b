// Semantics of Pillow 9.4 Image.getexif (Exif.load, TiffImagePlugin.ImageFileDirectory_v2.load)
// and ImageOps.exif_transpose, for the Orientation tag only.
#include "io/image_exif.h"

#include <cstring>

namespace fluxmpi::io {
namespace {

constexpr uint16_t kOrientationTag = 0x0112;

struct TiffReader {
  const uint8_t* data;
  size_t size;
  bool big_endian;

  bool has(size_t offset, size_t n) const { return offset <= size && n <= size - offset; }
  uint32_t u16(size_t at) const {
    return big_endian ? (uint32_t{data[at]} << 8) | data[at + 1] : (uint32_t{data[at + 1]} << 8) | data[at];
  }
  uint32_t u32(size_t at) const {
    return big_endian ? (u16(at) << 16) | u16(at + 2) : (u16(at + 2) << 16) | u16(at);
  }
};

// Size of one value of the integer TIFF types; 0 for the others, which Pillow decodes to values
// (strings, rationals, floats) that never equal 2..8 in practice.
int integer_type_size(uint32_t type) {
  switch (type) {
    case 1: case 6: return 1;   // BYTE, SBYTE
    case 3: case 8: return 2;   // SHORT, SSHORT
    case 4: case 9: return 4;   // LONG, SLONG
    default: return 0;
  }
}

int64_t integer_value(const TiffReader& r, size_t at, uint32_t type) {
  switch (type) {
    case 1: return r.data[at];
    case 6: return static_cast<int8_t>(r.data[at]);
    case 3: return r.u16(at);
    case 8: return static_cast<int16_t>(r.u16(at));
    case 4: return r.u32(at);
    default: return static_cast<int32_t>(r.u32(at));
  }
}

}  // namespace

int exif_orientation(const uint8_t* data, size_t size) {
  if (size >= 6 && std::memcmp(data, "Exif\0\0", 6) == 0) {
    data += 6;
    size -= 6;
  }
  if (size < 8) return 0;
  TiffReader r{data, size, false};
  if (std::memcmp(data, "MM\0*", 4) == 0) {
    r.big_endian = true;
  } else if (std::memcmp(data, "II*\0", 4) != 0) {
    return 0;  // not a (classic) TIFF header; BigTIFF EXIF does not occur in these formats
  }
  size_t at = r.u32(4);
  if (!r.has(at, 2)) return 0;
  const uint32_t entries = r.u16(at);
  at += 2;
  int orientation = 0;
  // Pillow keeps the entries read before an IFD that ends early, and a repeated tag's last value.
  for (uint32_t i = 0; i < entries && r.has(at, 12); ++i, at += 12) {
    if (r.u16(at) != kOrientationTag) continue;
    const uint32_t type = r.u16(at + 2);
    const uint32_t count = r.u32(at + 4);
    const int unit = integer_type_size(type);
    if (unit == 0 || count == 0) continue;
    // Values that do not fit in the entry live at an offset; a tag of one expected value takes
    // the first of several.
    size_t value_at = at + 8;
    if (static_cast<uint64_t>(count) * unit > 4) {
      value_at = r.u32(at + 8);
      if (!r.has(value_at, static_cast<size_t>(count) * unit)) continue;
    }
    const int64_t v = integer_value(r, value_at, type);
    orientation = (v >= 1 && v <= 8) ? static_cast<int>(v) : 1;
  }
  return orientation;
}

int xmp_orientation(const std::string& xmp) {
  static const char kKey[] = "tiff:Orientation";
  for (size_t at = xmp.find(kKey); at != std::string::npos; at = xmp.find(kKey, at + 1)) {
    size_t p = at + sizeof(kKey) - 1;
    if (xmp.compare(p, 2, "=\"") == 0) {
      p += 2;
    } else if (xmp.compare(p, 1, ">") == 0) {
      p += 1;
    } else {
      continue;
    }
    if (p < xmp.size() && xmp[p] >= '0' && xmp[p] <= '9') return xmp[p] - '0';
  }
  return 0;
}

Image8 apply_orientation(Image8 in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int W = in.width, H = in.height, C = in.channels;
  const bool swaps = orientation >= 5;  // transpose, rotations by 90 degrees, transverse
  Image8 out;
  out.width = swaps ? H : W;
  out.height = swaps ? W : H;
  out.channels = C;
  out.pixels.resize(in.pixels.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;  // the source pixel of output (x, y)
      switch (orientation) {
        case 2: sx = W - 1 - x; break;                        // FLIP_LEFT_RIGHT
        case 3: sx = W - 1 - x; sy = H - 1 - y; break;        // ROTATE_180
        case 4: sy = H - 1 - y; break;                        // FLIP_TOP_BOTTOM
        case 5: sx = y; sy = x; break;                        // TRANSPOSE
        case 6: sx = y; sy = H - 1 - x; break;                // ROTATE_270 (90 clockwise)
        case 7: sx = W - 1 - y; sy = H - 1 - x; break;        // TRANSVERSE
        default: sx = W - 1 - y; sy = x; break;               // 8: ROTATE_90 (counter-clockwise)
      }
      std::memcpy(&out.pixels[(static_cast<size_t>(y) * out.width + x) * C],
                  &in.pixels[(static_cast<size_t>(sy) * W + sx) * C], C);
    }
  }
  return out;
}

}  // namespace fluxmpi::io
