#include "io/png.h"

#include <png.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace fluxmpi::io {
namespace {

struct FileCloser {
  void operator()(FILE* f) const { if (f) std::fclose(f); }
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* out = static_cast<std::string*>(png_get_error_ptr(png));
  if (out) *out = message;
  std::longjmp(png_jmpbuf(png), 1);
}

void on_png_warning(png_structp, png_const_charp) {}

// The libpng calls that may longjmp, kept free of C++ objects with destructors.
bool encode_png(FILE* file, const RgbImage& image, png_text* chunks, int num_chunks, std::string* error) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, error, on_png_error, on_png_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (png == nullptr || info == nullptr) {
    png_destroy_write_struct(&png, &info);
    *error = "libpng initialisation failed";
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_init_io(png, file);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (num_chunks > 0) png_set_text(png, info, chunks, num_chunks);
  png_write_info(png, info);
  for (int64_t y = 0; y < image.height; ++y)
    png_write_row(png, const_cast<png_bytep>(image.pixels.data() + y * image.width * 3));
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

void write_png(const std::string& path, const RgbImage& image,
               const std::vector<std::pair<std::string, std::string>>& text) {
  FLUX_CHECK(image.height > 0 && image.width > 0 &&
                 static_cast<int64_t>(image.pixels.size()) == image.height * image.width * 3,
             "bad image buffer");
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path tmp = target.parent_path() / (".fluxmpi-tmp-" + std::to_string(::getpid()) + "-" + target.filename().string());
  std::vector<png_text> chunks(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    std::memset(&chunks[i], 0, sizeof(png_text));
    chunks[i].compression = PNG_ITXT_COMPRESSION_NONE;
    chunks[i].key = const_cast<char*>(text[i].first.c_str());
    chunks[i].text = const_cast<char*>(text[i].second.c_str());
    chunks[i].itxt_length = text[i].second.size();
  }
  FILE* raw = std::fopen(tmp.c_str(), "wb");
  if (raw == nullptr) throw IoError(str_cat("cannot write '", path, "': ", std::strerror(errno)));
  std::string error;
  bool ok = encode_png(raw, image, chunks.data(), static_cast<int>(chunks.size()), &error);
  if (ok && (std::fflush(raw) != 0 || ::fsync(::fileno(raw)) != 0)) {
    ok = false;
    error = std::strerror(errno);
  }
  if (std::fclose(raw) != 0 && ok) {
    ok = false;
    error = std::strerror(errno);
  }
  std::error_code ec;
  if (ok) {
    fs::rename(tmp, target, ec);
    if (ec) {
      ok = false;
      error = ec.message();
    }
  }
  if (!ok) {
    std::remove(tmp.c_str());
    throw IoError(str_cat("cannot write '", path, "': ", error));
  }
}

RgbImage read_png(const std::string& path, std::vector<std::pair<std::string, std::string>>* text) {
  FILE* raw = std::fopen(path.c_str(), "rb");
  if (raw == nullptr) throw IoError(str_cat("cannot read '", path, "': ", std::strerror(errno)));
  std::unique_ptr<FILE, FileCloser> file(raw);
  std::string error;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &error, on_png_error, on_png_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (png == nullptr || info == nullptr) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw IoError(str_cat("cannot read '", path, "': libpng initialisation failed"));
  }
  RgbImage image;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw IoError(str_cat("cannot read '", path, "': ", error));
  }
  png_init_io(png, raw);
  png_read_info(png, info);
  png_set_expand(png);
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  png_read_update_info(png, info);
  image.width = png_get_image_width(png, info);
  image.height = png_get_image_height(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(image.width * 3)) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw IoError(str_cat("cannot read '", path, "': unsupported pixel layout"));
  }
  image.pixels.resize(static_cast<size_t>(image.height * image.width * 3));
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (int64_t y = 0; y < image.height; ++y) rows[y] = image.pixels.data() + y * image.width * 3;
  png_read_image(png, rows.data());
  png_read_end(png, info);
  if (text != nullptr) {
    png_textp chunks = nullptr;
    int n = png_get_text(png, info, &chunks, nullptr);
    for (int i = 0; i < n; ++i) text->emplace_back(chunks[i].key, chunks[i].text ? chunks[i].text : "");
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return image;
}

}  // namespace fluxmpi::io
