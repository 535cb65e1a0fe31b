#pragma once
/// EXIF orientation of input images, as Pillow 9.4's Image.getexif and ImageOps.exif_transpose
/// read and apply it.

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/image_file.h"

namespace fluxmpi::io {

/// The Orientation tag (0x0112) of IFD0 of an EXIF block (a TIFF stream, with or without the
/// "Exif\0\0" prefix of JPEG APP1 and WebP EXIF chunks). 0 when the block has no such tag or
/// is malformed (Pillow would raise on a malformed header; we read the image unrotated); a tag
/// whose value is not 1..8 reads as 1, upright, and like any present tag rules out XMP.
int exif_orientation(const uint8_t* data, size_t size);

/// The orientation Pillow 9.4 takes from XMP when EXIF has none: the first digit after
/// `tiff:Orientation="` or `tiff:Orientation>`; 0 when there is none.
int xmp_orientation(const std::string& xmp);

/// ImageOps.exif_transpose: orientation 2..8 flips/rotates the image so that it displays upright
/// (6 = rotate 90 degrees clockwise); any other value returns it unchanged.
Image8 apply_orientation(Image8 image, int orientation);

}  // namespace fluxmpi::io
