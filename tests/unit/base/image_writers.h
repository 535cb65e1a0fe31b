#pragma once
// Test images made with libpng, libjpeg and libwebp (every mode and marker the decoders must
// handle), and the temporary folder they are written to. For image_file_test.

#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <unistd.h>
#include <webp/encode.h>

#include <csetjmp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fluxmpi::test {

using Bytes = std::vector<uint8_t>;

/// A folder of this process under the system's temporary directory, removed at exit.
class TempDir {
 public:
  TempDir() : path_(std::filesystem::temp_directory_path() / ("fluxmpi_image_test_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline const TempDir& tmp() {
  static TempDir dir;
  return dir;
}

inline std::string write_file(const std::string& name, const Bytes& bytes) {
  const std::string path = tmp().file(name);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return path;
}

struct PngSpec {
  int width = 0, height = 0, color_type = PNG_COLOR_TYPE_RGB, depth = 8;
  std::vector<int> samples;  ///< height * width * channels values, 0 .. 2^depth - 1
  std::vector<png_color> palette;
  Bytes trns;
  Bytes exif;
  std::vector<png_text> text;  ///< key and text owned by the caller
  bool interlaced = false;
};

inline PngSpec png_spec(int width, int height, int color_type, int depth, std::vector<int> samples) {
  PngSpec s;
  s.width = width;
  s.height = height;
  s.color_type = color_type;
  s.depth = depth;
  s.samples = std::move(samples);
  return s;
}

inline int png_channels(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY: case PNG_COLOR_TYPE_PALETTE: return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return 3;
    default: return 4;
  }
}

inline void on_png_error(png_structp png, png_const_charp) { std::longjmp(png_jmpbuf(png), 1); }
inline void on_png_write(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
inline void on_png_flush(png_structp) {}

// The libpng calls, kept apart from objects with destructors (they may longjmp).
inline bool encode_png(const PngSpec* s, png_bytepp rows, Bytes* out) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, on_png_error, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, out, on_png_write, on_png_flush);
  // Some tests write palette indices past the end of PLTE (Pillow reads them as grey); libpng
  // 1.6.48 (Debian 13) refuses to write those unless its check is turned off.
#ifdef PNG_CHECK_FOR_INVALID_INDEX_SUPPORTED
  png_set_check_for_invalid_index(png, 0);
#endif
  png_set_IHDR(png, info, s->width, s->height, s->depth, s->color_type,
               s->interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!s->palette.empty()) png_set_PLTE(png, info, s->palette.data(), static_cast<int>(s->palette.size()));
  if (!s->trns.empty()) png_set_tRNS(png, info, s->trns.data(), static_cast<int>(s->trns.size()), nullptr);
  if (!s->exif.empty()) {
    png_set_eXIf_1(png, info, static_cast<png_uint_32>(s->exif.size()), const_cast<png_bytep>(s->exif.data()));
  }
  if (!s->text.empty()) png_set_text(png, info, s->text.data(), static_cast<int>(s->text.size()));
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

// Packs the samples as PNG stores them: MSB first below 8 bits, big-endian at 16.
inline Bytes make_png(const PngSpec& s) {
  const int channels = png_channels(s.color_type);
  const size_t rowbytes = (static_cast<size_t>(s.width) * channels * s.depth + 7) / 8;
  Bytes raw(rowbytes * s.height, 0);
  for (int y = 0; y < s.height; ++y) {
    for (int i = 0; i < s.width * channels; ++i) {
      const int v = s.samples[static_cast<size_t>(y) * s.width * channels + i];
      uint8_t* row = &raw[y * rowbytes];
      if (s.depth == 16) {
        row[2 * i] = static_cast<uint8_t>(v >> 8);
        row[2 * i + 1] = static_cast<uint8_t>(v);
      } else if (s.depth == 8) {
        row[i] = static_cast<uint8_t>(v);
      } else {
        const int bit = i * s.depth;
        row[bit / 8] |= static_cast<uint8_t>(v << (8 - s.depth - bit % 8));
      }
    }
  }
  std::vector<png_bytep> rows(s.height);
  for (int y = 0; y < s.height; ++y) rows[y] = &raw[y * rowbytes];
  Bytes out;
  EXPECT_TRUE(encode_png(&s, rows.data(), &out)) << "libpng could not write the test image";
  return out;
}

struct JpegSink {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
};
inline void on_jpeg_error(j_common_ptr c) { std::longjmp(reinterpret_cast<JpegSink*>(c->err)->jump, 1); }

// Encodes `components` samples per pixel (in_space) at quality 90; `exif` becomes an APP1 marker.
inline bool encode_jpeg(int width, int height, int components, J_COLOR_SPACE in_space, const uint8_t* samples,
                 const Bytes* exif, unsigned char** out, unsigned long* size) {
  jpeg_compress_struct c;
  JpegSink err;
  c.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_jpeg_error;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&c);
    return false;
  }
  jpeg_create_compress(&c);
  jpeg_mem_dest(&c, out, size);
  c.image_width = width;
  c.image_height = height;
  c.input_components = components;
  c.in_color_space = in_space;
  jpeg_set_defaults(&c);
  if (in_space == JCS_UNKNOWN) jpeg_set_colorspace(&c, JCS_UNKNOWN);
  jpeg_set_quality(&c, 90, TRUE);
  jpeg_start_compress(&c, TRUE);
  if (exif) jpeg_write_marker(&c, JPEG_APP0 + 1, exif->data(), static_cast<unsigned>(exif->size()));
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(samples + static_cast<size_t>(c.next_scanline) * width * components);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return true;
}

inline Bytes make_jpeg(int width, int height, int components, J_COLOR_SPACE in_space, const Bytes& exif = {}) {
  Bytes samples(static_cast<size_t>(width) * height * components);
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<uint8_t>((i * 7 + i / 13 * 5) & 0xFF);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const bool ok = encode_jpeg(width, height, components, in_space, samples.data(), exif.empty() ? nullptr : &exif,
                              &buf, &size);
  Bytes out(buf, buf + (ok ? size : 0));
  free(buf);
  EXPECT_TRUE(ok) << "libjpeg could not write the test image";
  return out;
}

// libjpeg's own decode with its defaults, the reference for what read_image does with the samples.
inline bool decode_jpeg_raw(const Bytes* data, J_COLOR_SPACE out_space, Bytes* out) {
  jpeg_decompress_struct d;
  JpegSink err;
  d.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_jpeg_error;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&d);
    return false;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, data->data(), data->size());
  jpeg_read_header(&d, TRUE);
  d.out_color_space = out_space;
  jpeg_start_decompress(&d);
  out->resize(static_cast<size_t>(d.output_width) * d.output_height * d.output_components);
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = out->data() + static_cast<size_t>(d.output_scanline) * d.output_width * d.output_components;
    jpeg_read_scanlines(&d, &row, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  return true;
}

inline Bytes webp_lossless(const Bytes& pixels, int width, int height, int channels) {
  uint8_t* out = nullptr;
  const size_t n = channels == 4 ? WebPEncodeLosslessRGBA(pixels.data(), width, height, width * 4, &out)
                                 : WebPEncodeLosslessRGB(pixels.data(), width, height, width * 3, &out);
  Bytes b(out, out + n);
  WebPFree(out);
  EXPECT_GT(n, 0u) << "libwebp could not write the test image";
  return b;
}

inline void put_le32(Bytes& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// A simple (VP8L) file rewrapped as an extended one: VP8X with the EXIF flag, the image, EXIF.
inline Bytes webp_with_exif(const Bytes& simple, int width, int height, const Bytes& exif) {
  Bytes b = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0, 0x08, 0, 0, 0};
  for (int v : {width - 1, height - 1})
    for (int i = 0; i < 3; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  b.insert(b.end(), simple.begin() + 12, simple.end());
  const Bytes head = {'E', 'X', 'I', 'F', 0, 0, 0, 0};
  b.insert(b.end(), head.begin(), head.end());
  put_le32(b, b.size() - 4, static_cast<uint32_t>(exif.size()));
  b.insert(b.end(), exif.begin(), exif.end());
  if (exif.size() % 2) b.push_back(0);
  put_le32(b, 4, static_cast<uint32_t>(b.size() - 8));
  return b;
}

// A little-endian TIFF block "Exif\0\0" + IFD0 holding the given (tag, type, count, value) entries.
struct IfdEntry {
  uint16_t tag, type;
  uint32_t count, value;
};
inline Bytes exif_block(const std::vector<IfdEntry>& entries, bool big_endian = false, bool prefix = true) {
  Bytes b;
  auto put = [&](uint32_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * (big_endian ? n - 1 - i : i))));
  };
  if (prefix) b = {'E', 'x', 'i', 'f', 0, 0};
  const Bytes magic = big_endian ? Bytes{'M', 'M', 0, 42} : Bytes{'I', 'I', 42, 0};
  b.insert(b.end(), magic.begin(), magic.end());
  put(8, 4);
  put(static_cast<uint32_t>(entries.size()), 2);
  for (const IfdEntry& e : entries) {
    put(e.tag, 2);
    put(e.type, 2);
    put(e.count, 4);
    if (e.type == 3 && e.count == 1) {  // a SHORT sits in the first two bytes of the value field
      put(e.value, 2);
      put(0, 2);
    } else {
      put(e.value, 4);
    }
  }
  put(0, 4);
  return b;
}
inline Bytes orientation_exif(int v) { return exif_block({{0x0112, 3, 1, static_cast<uint32_t>(v)}}); }

}  // namespace fluxmpi::test
