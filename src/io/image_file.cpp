// Semantics of diffusers.utils.load_image with Pillow 9.4: PngImagePlugin (_MODES), JpegImagePlugin
// + JpegDecode.c, WebPImagePlugin, Unpack.c / Convert.c for the modes' conversions to RGB.
#include "io/image_file.h"

#include <jpeglib.h>
#include <jerror.h>  // after jpeglib.h, which it needs
#include <png.h>
#include <webp/decode.h>

#include <cctype>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "io/image_exif.h"

namespace fluxmpi::io {
namespace {

// A path that names no file is a usage error (exit 2), as for every other path option; a file
// that is there but is no usable image is bad input data (ImageError, exit 3).
[[noreturn]] void bad_image(const std::string& label, const std::string& what) {
  throw ImageError(str_cat("'", label, "': ", what));
}
[[noreturn]] void bad_path(const std::string& label, const std::string& what) {
  throw UsageError(str_cat("'", label, "': ", what));
}

void check_size(const std::string& label, const char* format, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0) {
    bad_image(label, str_cat(format, " image of ", width, "x", height, " pixels is empty"));
  }
  if (width > kMaxImageSide || height > kMaxImageSide || width * height > kMaxImagePixels) {
    bad_image(label, str_cat(format, " image of ", width, "x", height, " pixels is larger than the limit of ",
                             kMaxImageSide, " pixels per side and 2^28 pixels in all"));
  }
}

Image8 new_rgb(int width, int height) {
  return Image8{width, height, 3, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
}

struct Decoded {
  Image8 rgb;
  int orientation = 0;
};

// ---- PNG -------------------------------------------------------------------------------------
// libpng reports errors by longjmp. Every call that may jump sits in a png_* phase function below
// that holds no object with a destructor; the state they share lives in PngState, owned by the
// C++ caller, and the callbacks only copy the message into a fixed buffer.

struct PngState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_infop end = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  bool truncated = false;
  char message[256] = {};

  ~PngState() { png_destroy_read_struct(&png, &info, &end); }
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", message);
  std::longjmp(png_jmpbuf(png), 1);
}

void png_on_warning(png_structp, png_const_charp) {}

void png_on_read(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  if (s->size - s->pos < n) {
    s->truncated = true;
    png_error(png, "truncated");
  }
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

bool png_read_head(PngState* s) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_set_read_fn(s->png, s, png_on_read);
  // Sizes are checked by check_size, with the message every format shares.
  png_set_user_limits(s->png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
  // Pillow rejects a bad checksum in any chunk before the image data, ancillary ones included.
  png_set_crc_action(s->png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
  png_read_info(s->png, s->info);
  return true;
}

bool png_prepare_rows(PngState* s, size_t* rowbytes) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  // One byte per sample below 8 bits, values not rescaled: the mode conversion below does that
  // as Pillow's unpackers do. 16-bit samples stay big-endian.
  if (png_get_bit_depth(s->png, s->info) < 8) png_set_packing(s->png);
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  *rowbytes = png_get_rowbytes(s->png, s->info);
  return true;
}

bool png_read_rows(PngState* s, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_read_image(s->png, rows);
  return true;
}

bool png_read_tail(PngState* s) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_read_end(s->png, s->end);
  return true;
}

[[noreturn]] void png_failed(const PngState& s, const std::string& label) {
  if (s.truncated) bad_image(label, "truncated PNG data");
  bad_image(label, str_cat("bad PNG data (libpng: ", s.message, ")"));
}

// Pillow's EXIF sources, in its order: eXIf, else a "Raw profile type exif" text chunk (hex after
// three header lines); XMP only when EXIF has no orientation.
int png_orientation(PngState& s) {
  std::string exif, raw_profile, xmp;
  for (png_infop info : {s.info, s.end}) {
    png_uint_32 n = 0;
    png_bytep bytes = nullptr;
    if (png_get_eXIf_1(s.png, info, &n, &bytes) != 0 && bytes != nullptr) {
      exif.assign(reinterpret_cast<char*>(bytes), n);
    }
    png_textp text = nullptr;
    int count = 0;
    png_get_text(s.png, info, &text, &count);
    for (int i = 0; i < count; ++i) {
      const std::string value = text[i].text ? text[i].text : "";
      if (std::strcmp(text[i].key, "Raw profile type exif") == 0) raw_profile = value;
      if (std::strcmp(text[i].key, "XML:com.adobe.xmp") == 0) xmp = value;
    }
  }
  if (exif.empty() && !raw_profile.empty()) {
    // "".join(value.split("\n")[3:]) then bytes.fromhex, which skips whitespace.
    size_t at = 0;
    for (int line = 0; line < 3 && at != std::string::npos; ++line) {
      at = raw_profile.find('\n', at);
      if (at != std::string::npos) ++at;
    }
    std::string hex;
    if (at != std::string::npos) {
      for (size_t i = at; i < raw_profile.size(); ++i) {
        if (!std::isspace(static_cast<unsigned char>(raw_profile[i]))) hex += raw_profile[i];
      }
    }
    if (hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) hex.clear();
    for (size_t i = 0; i < hex.size(); i += 2) exif += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  int orientation = exif_orientation(reinterpret_cast<const uint8_t*>(exif.data()), exif.size());
  if (orientation == 0) orientation = xmp_orientation(xmp);
  return orientation;
}

Decoded decode_png(const uint8_t* data, size_t size, const std::string& label) {
  PngState s;
  s.data = data;
  s.size = size;
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_on_error, png_on_warning);
  if (s.png) s.info = png_create_info_struct(s.png);
  if (s.png) s.end = png_create_info_struct(s.png);
  if (!s.png || !s.info || !s.end) throw IoError(str_cat("'", label, "': libpng initialisation failed"));
  if (!png_read_head(&s)) png_failed(s, label);
  const int64_t width = png_get_image_width(s.png, s.info);
  const int64_t height = png_get_image_height(s.png, s.info);
  check_size(label, "PNG", width, height);
  const int depth = png_get_bit_depth(s.png, s.info);
  const int type = png_get_color_type(s.png, s.info);
  size_t rowbytes = 0;
  if (!png_prepare_rows(&s, &rowbytes)) png_failed(s, label);
  std::vector<uint8_t> raw(rowbytes * height);
  std::vector<png_bytep> rows(height);
  for (int64_t y = 0; y < height; ++y) rows[y] = raw.data() + y * rowbytes;
  if (!png_read_rows(&s, rows.data())) png_failed(s, label);
  // Pillow reads what follows the image data leniently: a damaged or missing tail (IEND, late
  // text or eXIf chunks) does not fail the load.
  png_read_tail(&s);

  Decoded out{new_rgb(static_cast<int>(width), static_cast<int>(height)), png_orientation(s)};
  // The sample values of PNG modes as Pillow 9.4 maps them (_MODES), then convert('RGB'):
  //   grey 1 bit "1" -> 0/255; 2 and 4 bits "L;2"/"L;4" scale by 0x55/0x11; 16 bits become mode I
  //   (the full 0..65535 value), which convert('RGB') clips to 255, it does not rescale;
  //   RGB/RGBA/grey+alpha 16 bits keep the high byte; alpha is dropped, never composited;
  //   palette indices look up PLTE, indices past its end the grey ramp Pillow's palette starts as.
  const int channels_in = type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_PALETTE ? 1
                          : type == PNG_COLOR_TYPE_GRAY_ALPHA                          ? 2
                          : type == PNG_COLOR_TYPE_RGB                                 ? 3
                                                                                       : 4;
  const int bytes_per_sample = depth == 16 ? 2 : 1;
  uint8_t palette[256][3];
  if (type == PNG_COLOR_TYPE_PALETTE) {
    for (int i = 0; i < 256; ++i) palette[i][0] = palette[i][1] = palette[i][2] = static_cast<uint8_t>(i);
    png_colorp plte = nullptr;
    int n = 0;
    png_get_PLTE(s.png, s.info, &plte, &n);
    for (int i = 0; i < n && i < 256; ++i) {
      palette[i][0] = plte[i].red;
      palette[i][1] = plte[i].green;
      palette[i][2] = plte[i].blue;
    }
  }
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* in = rows[y];
    uint8_t* o = &out.rgb.pixels[y * width * 3];
    for (int64_t x = 0; x < width; ++x, o += 3, in += channels_in * bytes_per_sample) {
      if (type == PNG_COLOR_TYPE_PALETTE) {
        std::memcpy(o, palette[in[0]], 3);
      } else if (channels_in <= 2) {  // grey, grey + alpha
        uint8_t v = in[0];
        if (depth == 1) v = in[0] ? 255 : 0;
        if (depth == 2) v = static_cast<uint8_t>(in[0] * 0x55);
        if (depth == 4) v = static_cast<uint8_t>(in[0] * 0x11);
        if (depth == 16 && channels_in == 1) {
          const int wide = (in[0] << 8) | in[1];
          v = static_cast<uint8_t>(wide >= 255 ? 255 : wide);
        }
        o[0] = o[1] = o[2] = v;
      } else {
        for (int c = 0; c < 3; ++c) o[c] = in[c * bytes_per_sample];
      }
    }
  }
  return out;
}

// ---- JPEG ------------------------------------------------------------------------------------
// Same discipline as PNG: libjpeg's error_exit longjmps back into the jpeg_* phase functions.

struct JpegErrors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool hit_end = false;  // the data ran out (libjpeg then pretends an EOI marker and warns)
  char message[JMSG_LENGTH_MAX] = {};
};

struct JpegState {
  jpeg_decompress_struct cinfo{};
  JpegErrors errors;
  bool created = false;
  bool truncated = false;

  ~JpegState() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Pillow ignores libjpeg's warnings (corrupt-data notes); running out of data it treats as a
// truncated file, which the flag records.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) reinterpret_cast<JpegErrors*>(cinfo->err)->hit_end = true;
}

void jpeg_on_output(j_common_ptr) {}

bool jpeg_read_head(JpegState* s, const uint8_t* data, size_t size) {
  s->cinfo.err = jpeg_std_error(&s->errors.pub);
  s->errors.pub.error_exit = jpeg_on_error;
  s->errors.pub.emit_message = jpeg_on_message;
  s->errors.pub.output_message = jpeg_on_output;
  if (setjmp(s->errors.jump)) return false;
  jpeg_create_decompress(&s->cinfo);
  s->created = true;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&s->cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&s->cinfo, TRUE);
  return true;
}

bool jpeg_read_pixels(JpegState* s, uint8_t* out, size_t stride) {
  if (setjmp(s->errors.jump)) return false;
  jpeg_start_decompress(&s->cinfo);
  while (s->cinfo.output_scanline < s->cinfo.output_height) {
    JSAMPROW row = out + s->cinfo.output_scanline * stride;
    jpeg_read_scanlines(&s->cinfo, &row, 1);
  }
  // Pillow's decoder suspends where this one runs out of data, and fails with "image file is
  // truncated" unless every scan line is out by then: running out in jpeg_finish_decompress is fine.
  s->truncated = s->errors.hit_end;
  jpeg_finish_decompress(&s->cinfo);
  return true;
}

[[noreturn]] void jpeg_failed(const JpegState& s, const std::string& label) {
  if (s.errors.hit_end) bad_image(label, "truncated JPEG data");
  bad_image(label, str_cat("bad JPEG data (libjpeg: ", s.errors.message, ")"));
}

Decoded decode_jpeg(const uint8_t* data, size_t size, const std::string& label) {
  auto s = std::make_unique<JpegState>();
  if (!jpeg_read_head(s.get(), data, size)) jpeg_failed(*s, label);
  jpeg_decompress_struct& cinfo = s->cinfo;
  check_size(label, "JPEG", cinfo.image_width, cinfo.image_height);
  const int components = cinfo.num_components;
  // Pillow's modes by number of components: L, RGB, CMYK (read as Adobe-inverted CMYK).
  if (components == 1) {
    cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (components == 3) {
    cinfo.out_color_space = JCS_RGB;
  } else if (components == 4) {
    cinfo.out_color_space = JCS_CMYK;
  } else {
    bad_image(label, str_cat("JPEG with ", components, " components is not supported (1, 3 or 4)"));
  }
  int orientation = 0;
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m != nullptr; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 5 && std::memcmp(m->data, "Exif\0", 5) == 0) {
      orientation = exif_orientation(m->data, m->data_length);
      break;  // Pillow keeps the first Exif segment
    }
  }
  const int width = static_cast<int>(cinfo.image_width), height = static_cast<int>(cinfo.image_height);
  std::vector<uint8_t> samples(static_cast<size_t>(width) * height * components);
  if (!jpeg_read_pixels(s.get(), samples.data(), static_cast<size_t>(width) * components)) jpeg_failed(*s, label);
  if (s->truncated) bad_image(label, "truncated JPEG data");

  Decoded out{new_rgb(width, height), orientation};
  uint8_t* o = out.rgb.pixels.data();
  const size_t n = static_cast<size_t>(width) * height;
  for (size_t i = 0; i < n; ++i, o += 3) {
    const uint8_t* in = &samples[i * components];
    if (components == 1) {
      o[0] = o[1] = o[2] = in[0];
    } else if (components == 3) {
      std::memcpy(o, in, 3);
    } else {
      // Pillow inverts the samples ("CMYK;I"), then cmyk2rgb: out = nk - nk * c / 255 with
      // nk = 255 - k and its rounded division by 255. After the inversion nk is the stored K.
      const int nk = in[3];
      for (int c = 0; c < 3; ++c) {
        const int t = (255 - in[c]) * nk + 128;
        const int v = nk - (((t >> 8) + t) >> 8);
        o[c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
      }
    }
  }
  return out;
}

// ---- WebP ------------------------------------------------------------------------------------

uint32_t le32(const uint8_t* p) {
  return p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// Pillow reads the first EXIF chunk of an extended (VP8X) file; a simple file has none.
int webp_orientation(const uint8_t* data, size_t size) {
  if (size < 20 || std::memcmp(data + 12, "VP8X", 4) != 0) return 0;
  for (size_t at = 12; size - at >= 8;) {
    const size_t length = le32(data + at + 4);
    if (length > size - at - 8) return 0;
    if (std::memcmp(data + at, "EXIF", 4) == 0) return exif_orientation(data + at + 8, length);
    at += 8 + length + (length & 1);
    if (at > size) return 0;
  }
  return 0;
}

std::string webp_status(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_NOT_ENOUGH_DATA: return "truncated WebP data";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported WebP feature";
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory decoding the WebP image";
    default: return str_cat("bad WebP data (libwebp status ", static_cast<int>(status), ")");
  }
}

Decoded decode_webp(const uint8_t* data, size_t size, const std::string& label) {
  WebPBitstreamFeatures features;
  VP8StatusCode status = WebPGetFeatures(data, size, &features);
  if (status != VP8_STATUS_OK) bad_image(label, webp_status(status));
  if (features.has_animation) bad_image(label, "animated WebP images are not supported");
  check_size(label, "WebP", features.width, features.height);
  Decoded out{new_rgb(features.width, features.height), webp_orientation(data, size)};
  // Pillow decodes to RGBA through WebPAnimDecoder and drops the alpha: the RGB samples equal
  // those of a plain RGB decode with the default options.
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) throw IoError(str_cat("'", label, "': libwebp initialisation failed"));
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = out.rgb.pixels.data();
  config.output.u.RGBA.stride = features.width * 3;
  config.output.u.RGBA.size = out.rgb.pixels.size();
  status = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);
  if (status != VP8_STATUS_OK) bad_image(label, webp_status(status));
  return out;
}

}  // namespace

Image8 decode_image(const uint8_t* data, size_t size, const std::string& label) {
  if (size == 0) bad_image(label, "empty file");
  Decoded d;
  if (size >= 8 && std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0) {
    d = decode_png(data, size, label);
  } else if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
    d = decode_jpeg(data, size, label);
  } else if (size >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0) {
    d = decode_webp(data, size, label);
  } else {
    bad_image(label, "not a PNG, JPEG or WebP image");
  }
  return apply_orientation(std::move(d.rgb), d.orientation);
}

Image8 read_image(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) bad_path(path, "not found");
  if (fs::is_directory(st)) bad_path(path, "is a directory, not a file");
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw IoError(str_cat("'", path, "': cannot open: ", std::strerror(errno)));
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw IoError(str_cat("'", path, "': cannot read its size: ", ec.message()));
  if (size > kMaxImageFileBytes) bad_image(path, str_cat("file of ", size, " bytes is larger than the 1 GiB limit"));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (size > 0 && std::fread(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
    const char* why = std::ferror(file.get()) ? std::strerror(errno) : "the file shrank while being read";
    throw IoError(str_cat("'", path, "': cannot read: ", why));
  }
  return decode_image(bytes.data(), bytes.size(), path);
}

Image8 to_grey(const Image8& image) {
  if (image.channels == 1) return image;
  FLUX_CHECK(image.channels == 3, "to_grey needs an RGB or grey image, got ", image.channels, " channels");
  Image8 out{image.width, image.height, 1, std::vector<uint8_t>(static_cast<size_t>(image.width) * image.height)};
  for (size_t i = 0; i < out.pixels.size(); ++i) {
    const uint8_t* p = &image.pixels[i * 3];
    out.pixels[i] = static_cast<uint8_t>((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
  }
  return out;
}

Image8 binarize_mask(const Image8& grey) {
  FLUX_CHECK(grey.channels == 1, "binarize_mask needs a grey image, got ", grey.channels, " channels");
  Image8 out = grey;
  for (uint8_t& v : out.pixels) v = v >= 128 ? 1 : 0;
  return out;
}

}  // namespace fluxmpi::io
