// Input image decoding: the image-inputs fixtures' load_image outputs bit for bit, Pillow 9.4's
// conversion of every PNG mode, JPEG and WebP variants made here with the libraries, EXIF
// orientation, and one message naming the file for each kind of bad input.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "image_cases.h"
#include "image_writers.h"
#include "io/image_exif.h"

namespace fluxmpi::io {
namespace {

namespace fs = std::filesystem;
using test::Bytes;
using test::compare_images;
using test::decode_jpeg_raw;
using test::exif_block;
using test::make_jpeg;
using test::make_png;
using test::orientation_exif;
using test::png_spec;
using test::PngSpec;
using test::tmp;
using test::webp_lossless;
using test::webp_with_exif;
using test::write_file;

Image8 rgb_of(int width, int height, Bytes pixels) { return Image8{width, height, 3, std::move(pixels)}; }
std::vector<int> samples_of(const Image8& im) { return std::vector<int>(im.pixels.begin(), im.pixels.end()); }

std::string error_of(const std::string& path) {
  try {
    read_image(path);
  } catch (const Error& e) {
    // A path naming no file is a usage error (exit 2); a file that is no usable image, bad input data (3).
    const bool path_problem = std::string(e.what()).find("': not found") != std::string::npos ||
                              std::string(e.what()).find("': is a directory") != std::string::npos;
    EXPECT_STREQ(e.kind(), path_problem ? "UsageError" : "ImageError") << e.what();
    EXPECT_EQ(e.exit_code(), path_problem ? kExitUsage : kExitBadInput) << e.what();
    return e.what();
  }
  return "(no error)";
}

Image8 noise_rgb(int width, int height) {
  Image8 im{width, height, 3, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 37 + i / 5) & 0xFF);
  return im;
}

// ---- the fixtures ---------------------------------------------------------------------------

class ImageFileFixture : public testing::TestWithParam<test::ImageArg> {};

TEST_P(ImageFileFixture, MatchesLoadImage) {
  const test::ImageArg& a = GetParam();
  FLUXMPI_REQUIRE_IMAGE_CASE(a);
  SafetensorsFile f(a.tensors);
  EXPECT_EQ(compare_images(read_image(a.file), test::fixture_image(f, a.input, a.index)), "identical")
      << a.input << " of '" << a.file << "', tolerance 0";
}

INSTANTIATE_TEST_SUITE_P(ImageInputs, ImageFileFixture, testing::ValuesIn(test::image_args()), test::image_arg_name);

// ---- PNG modes (Pillow 9.4 _MODES, then convert('RGB')) ---------------------------------------

Image8 decode_png_spec(const PngSpec& s, const std::string& name) { return read_image(write_file(name, make_png(s))); }

TEST(ImageFilePng, RgbAndRgbaDropTheAlphaWithoutCompositing) {
  PngSpec rgb = png_spec(3, 1, PNG_COLOR_TYPE_RGB, 8, {1, 2, 3, 250, 251, 252, 0, 128, 255});
  EXPECT_EQ(decode_png_spec(rgb, "rgb.png").pixels, (Bytes{1, 2, 3, 250, 251, 252, 0, 128, 255}));
  PngSpec rgba = png_spec(2, 1, PNG_COLOR_TYPE_RGBA, 8, {10, 20, 30, 0, 200, 100, 50, 128});
  const Image8 im = decode_png_spec(rgba, "rgba.png");
  EXPECT_EQ(im.channels, 3);
  EXPECT_EQ(im.pixels, (Bytes{10, 20, 30, 200, 100, 50}));
}

TEST(ImageFilePng, GreyDepthsScaleAsPillowUnpacks) {
  const std::vector<std::pair<int, std::vector<int>>> cases = {
      {1, {0, 1}}, {2, {0, 1, 2, 3}}, {4, {0, 1, 7, 15}}, {8, {0, 1, 127, 255}}};
  const std::vector<Bytes> want = {{0, 255}, {0, 85, 170, 255}, {0, 17, 119, 255}, {0, 1, 127, 255}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [depth, values] = cases[i];
    PngSpec s = png_spec(static_cast<int>(values.size()), 1, PNG_COLOR_TYPE_GRAY, depth, values);
    const Image8 im = decode_png_spec(s, "grey" + std::to_string(depth) + ".png");
    for (size_t x = 0; x < values.size(); ++x) {
      EXPECT_EQ(int{im.at(0, static_cast<int>(x), 0)}, want[i][x]) << depth << "-bit grey " << values[x];
      EXPECT_EQ(im.at(0, static_cast<int>(x), 1), im.at(0, static_cast<int>(x), 0));
      EXPECT_EQ(im.at(0, static_cast<int>(x), 2), im.at(0, static_cast<int>(x), 0));
    }
  }
}

// 16-bit grey is mode I (0..65535) and convert('RGB') clips it to 255; it does not keep the high
// byte as the 16-bit colour and grey+alpha modes do.
TEST(ImageFilePng, SixteenBitGreyClipsOtherSixteenBitModesKeepTheHighByte) {
  PngSpec grey = png_spec(7, 1, PNG_COLOR_TYPE_GRAY, 16, {0, 1, 254, 255, 256, 1000, 65535});
  EXPECT_EQ(decode_png_spec(grey, "grey16.png").pixels,
            (Bytes{0, 0, 0, 1, 1, 1, 254, 254, 254, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255}));
  PngSpec ga = png_spec(2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 16, {0x12FF, 0, 0xAB01, 0xFFFF});
  EXPECT_EQ(decode_png_spec(ga, "ga16.png").pixels, (Bytes{0x12, 0x12, 0x12, 0xAB, 0xAB, 0xAB}));
  PngSpec rgb = png_spec(1, 1, PNG_COLOR_TYPE_RGB, 16, {0x0102, 0x80FF, 0xFF00});
  EXPECT_EQ(decode_png_spec(rgb, "rgb16.png").pixels, (Bytes{0x01, 0x80, 0xFF}));
  PngSpec rgba = png_spec(1, 1, PNG_COLOR_TYPE_RGBA, 16, {0x0102, 0x80FF, 0xFF00, 0});
  EXPECT_EQ(decode_png_spec(rgba, "rgba16.png").pixels, (Bytes{0x01, 0x80, 0xFF}));
}

TEST(ImageFilePng, GreyAlphaReplicatesTheGrey) {
  PngSpec s = png_spec(3, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, {5, 0, 128, 128, 255, 255});
  EXPECT_EQ(decode_png_spec(s, "ga8.png").pixels, (Bytes{5, 5, 5, 128, 128, 128, 255, 255, 255}));
}

// Indices past the end of PLTE take the grey ramp Pillow's palettes start from; tRNS changes
// nothing in convert('RGB').
TEST(ImageFilePng, PaletteLooksUpPlteAndIgnoresTransparency) {
  PngSpec s = png_spec(4, 1, PNG_COLOR_TYPE_PALETTE, 8, {0, 1, 2, 200});
  s.palette = {{255, 0, 0}, {0, 255, 0}, {1, 2, 3}};
  s.trns = {0, 128};
  EXPECT_EQ(decode_png_spec(s, "p8.png").pixels, (Bytes{255, 0, 0, 0, 255, 0, 1, 2, 3, 200, 200, 200}));
  for (int depth : {1, 2, 4}) {
    PngSpec p = png_spec(2, 1, PNG_COLOR_TYPE_PALETTE, depth, {0, 1});
    p.palette = {{9, 8, 7}, {6, 5, 4}};
    EXPECT_EQ(decode_png_spec(p, "p" + std::to_string(depth) + ".png").pixels, (Bytes{9, 8, 7, 6, 5, 4}))
        << depth << "-bit palette";
  }
}

TEST(ImageFilePng, InterlacedEqualsProgressive) {
  PngSpec s = png_spec(13, 11, PNG_COLOR_TYPE_RGB, 8, {});
  for (int i = 0; i < 13 * 11 * 3; ++i) s.samples.push_back((i * 29) & 0xFF);
  const Image8 plain = decode_png_spec(s, "plain.png");
  s.interlaced = true;
  EXPECT_EQ(compare_images(decode_png_spec(s, "adam7.png"), plain), "identical");
}

// ---- JPEG -------------------------------------------------------------------------------------

TEST(ImageFileJpeg, ColourAndGreyAreLibjpegDefaults) {
  const Bytes rgb = make_jpeg(21, 10, 3, JCS_RGB);
  Bytes want;
  ASSERT_TRUE(decode_jpeg_raw(&rgb, JCS_RGB, &want));
  EXPECT_EQ(compare_images(read_image(write_file("rgb.jpg", rgb)), rgb_of(21, 10, want)), "identical");
  const Bytes grey = make_jpeg(9, 7, 1, JCS_GRAYSCALE);
  ASSERT_TRUE(decode_jpeg_raw(&grey, JCS_GRAYSCALE, &want));
  Bytes replicated;
  for (uint8_t v : want) replicated.insert(replicated.end(), {v, v, v});
  EXPECT_EQ(compare_images(read_image(write_file("grey.jpg", grey)), rgb_of(9, 7, replicated)), "identical");
}

// Pillow reads 4-component JPEGs as Adobe-inverted CMYK, then convert('RGB') = nk - nk*c/255.
TEST(ImageFileJpeg, CmykConvertsAsPillow) {
  const Bytes cmyk = make_jpeg(8, 8, 4, JCS_CMYK);
  Bytes raw;
  ASSERT_TRUE(decode_jpeg_raw(&cmyk, JCS_CMYK, &raw));
  const Image8 got = read_image(write_file("cmyk.jpg", cmyk));
  // Pillow's MULDIV255 is the rounded product / 255 (no ties occur for 8-bit operands).
  Bytes exact;
  for (size_t i = 0; i < raw.size(); i += 4) {
    for (int k = 0; k < 3; ++k) {
      const double v = raw[i + 3] - std::round((255 - raw[i + k]) * raw[i + 3] / 255.0);
      exact.push_back(static_cast<uint8_t>(v));
    }
  }
  EXPECT_EQ(compare_images(got, rgb_of(8, 8, exact)), "identical");
}

// Without its EOI marker the entropy decoder runs out of data on the last rows: Pillow 9.4 stops
// there too ("image file is truncated").
TEST(ImageFileJpeg, AMissingEndMarkerIsATruncation) {
  const Bytes full = make_jpeg(16, 16, 3, JCS_RGB);
  ASSERT_EQ(full[full.size() - 2], 0xFF);
  ASSERT_EQ(full[full.size() - 1], 0xD9);
  const std::string p = write_file("noeoi.jpg", Bytes(full.begin(), full.end() - 2));
  EXPECT_EQ(error_of(p), "'" + p + "': truncated JPEG data");
}

// ---- WebP -------------------------------------------------------------------------------------

TEST(ImageFileWebp, LosslessIsExactAndAlphaIsDropped) {
  const Image8 im = noise_rgb(17, 9);
  EXPECT_EQ(compare_images(read_image(write_file("rgb.webp", webp_lossless(im.pixels, 17, 9, 3))), im), "identical");
  Bytes rgba;
  for (size_t i = 0; i < im.pixels.size(); i += 3) {
    rgba.insert(rgba.end(), {im.pixels[i], im.pixels[i + 1], im.pixels[i + 2], 128});
  }
  EXPECT_EQ(compare_images(read_image(write_file("rgba.webp", webp_lossless(rgba, 17, 9, 4))), im), "identical");
}

// ---- EXIF orientation -------------------------------------------------------------------------

TEST(ImageExif, ReadsTheOrientationTagOfIfd0) {
  const Bytes le = orientation_exif(6);
  EXPECT_EQ(exif_orientation(le.data(), le.size()), 6);
  const Bytes be = exif_block({{0x0110, 2, 4, 0}, {0x0112, 3, 1, 3}}, true);
  EXPECT_EQ(exif_orientation(be.data(), be.size()), 3);
  const Bytes bare = exif_block({{0x0112, 4, 1, 8}}, false, false);  // LONG, no "Exif\0\0"
  EXPECT_EQ(exif_orientation(bare.data(), bare.size()), 8);
  const Bytes two = exif_block({{0x0112, 3, 2, 5 | (2u << 16)}});  // two SHORTs: the first counts
  EXPECT_EQ(exif_orientation(two.data(), two.size()), 5);
  const Bytes last = exif_block({{0x0112, 3, 1, 2}, {0x0112, 3, 1, 7}});
  EXPECT_EQ(exif_orientation(last.data(), last.size()), 7);
  const Bytes none = exif_block({{0x0110, 2, 4, 0}});
  EXPECT_EQ(exif_orientation(none.data(), none.size()), 0);
  const Bytes odd = orientation_exif(9);
  EXPECT_EQ(exif_orientation(odd.data(), odd.size()), 1);
  Bytes bad = le;
  bad[6] = 'X';
  EXPECT_EQ(exif_orientation(bad.data(), bad.size()), 0);
  const Bytes cut(le.begin(), le.begin() + 20);  // the IFD ends before its entry
  EXPECT_EQ(exif_orientation(cut.data(), cut.size()), 0);
  EXPECT_EQ(xmp_orientation(R"(<x tiff:Orientation="6"/>)"), 6);
  EXPECT_EQ(xmp_orientation("<tiff:Orientation>3</tiff:Orientation>"), 3);
  EXPECT_EQ(xmp_orientation("<tiff:OrientationX>3</tiff:OrientationX>"), 0);
}

TEST(ImageExif, TransposesAsImageOpsExifTranspose) {
  const Image8 in{3, 2, 1, {0, 1, 2, 10, 11, 12}};
  const std::vector<std::pair<int, Image8>> want = {
      {1, {3, 2, 1, {0, 1, 2, 10, 11, 12}}},  {2, {3, 2, 1, {2, 1, 0, 12, 11, 10}}},
      {3, {3, 2, 1, {12, 11, 10, 2, 1, 0}}},  {4, {3, 2, 1, {10, 11, 12, 0, 1, 2}}},
      {5, {2, 3, 1, {0, 10, 1, 11, 2, 12}}},  {6, {2, 3, 1, {10, 0, 11, 1, 12, 2}}},
      {7, {2, 3, 1, {12, 2, 11, 1, 10, 0}}},  {8, {2, 3, 1, {2, 12, 1, 11, 0, 10}}},
  };
  for (const auto& [orientation, w] : want) {
    EXPECT_EQ(compare_images(apply_orientation(in, orientation), w), "identical") << "orientation " << orientation;
  }
}

TEST(ImageExif, EveryFormatCarriesItsOrientation) {
  const Image8 im = noise_rgb(5, 3);
  PngSpec s = png_spec(5, 3, PNG_COLOR_TYPE_RGB, 8, samples_of(im));
  s.exif = exif_block({{0x0112, 3, 1, 6}}, false, false);  // eXIf holds the TIFF data alone
  EXPECT_EQ(compare_images(decode_png_spec(s, "exif.png"), apply_orientation(im, 6)), "identical") << "PNG eXIf";

  // ImageMagick's text form, then XMP, which counts only without an EXIF orientation.
  const Bytes tiff = orientation_exif(4);
  std::string hex;
  for (uint8_t b : tiff) hex += "0123456789abcdef"[b >> 4], hex += "0123456789abcdef"[b & 15];
  std::string profile =
      "\nexif\n      " + std::to_string(tiff.size()) + "\n" + hex.substr(0, 20) + "\n" + hex.substr(20) + "\n";
  std::string key = "Raw profile type exif", xmp_key = "XML:com.adobe.xmp", xmp = R"(<x tiff:Orientation="2"/>)";
  PngSpec t = png_spec(5, 3, PNG_COLOR_TYPE_RGB, 8, s.samples);
  t.text.resize(1);
  t.text[0].compression = PNG_TEXT_COMPRESSION_zTXt;
  t.text[0].key = key.data();
  t.text[0].text = profile.data();
  EXPECT_EQ(compare_images(decode_png_spec(t, "raw.png"), apply_orientation(im, 4)), "identical") << "raw profile";
  PngSpec x = png_spec(5, 3, PNG_COLOR_TYPE_RGB, 8, s.samples);
  x.text.resize(1);
  x.text[0].compression = PNG_ITXT_COMPRESSION_NONE;
  x.text[0].key = xmp_key.data();
  x.text[0].text = xmp.data();
  EXPECT_EQ(compare_images(decode_png_spec(x, "xmp.png"), apply_orientation(im, 2)), "identical") << "XMP";
  x.exif = exif_block({{0x0112, 3, 1, 1}}, true, false);
  EXPECT_EQ(compare_images(decode_png_spec(x, "xmp_exif.png"), im), "identical") << "EXIF 1 rules out XMP";

  const Bytes plain = make_jpeg(16, 8, 3, JCS_RGB), turned = make_jpeg(16, 8, 3, JCS_RGB, orientation_exif(3));
  const Image8 upright = read_image(write_file("plain.jpg", plain));
  EXPECT_EQ(compare_images(read_image(write_file("exif.jpg", turned)), apply_orientation(upright, 3)), "identical")
      << "JPEG APP1";

  const Bytes webp = webp_with_exif(webp_lossless(im.pixels, 5, 3, 3), 5, 3, orientation_exif(8));
  const Image8 w = read_image(write_file("exif.webp", webp));
  EXPECT_EQ(compare_images(w, apply_orientation(im, 8)), "identical") << "WebP EXIF chunk";
}

// ---- grey masks -------------------------------------------------------------------------------

TEST(ImageMask, GreyIsPillowsConvertL) {
  const Image8 rgb{5, 1, 3, {0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 255, 0, 0, 0, 255}};
  EXPECT_EQ(to_grey(rgb).pixels, (Bytes{0, 255, 76, 150, 29}));
  EXPECT_EQ(to_grey(to_grey(rgb)).pixels, to_grey(rgb).pixels);
}

// diffusers binarises float32(grey) / 255 at 0.5; on 8-bit values that is grey >= 128.
TEST(ImageMask, BinarisationEqualsDiffusersInFloat32) {
  Image8 grey{256, 1, 1, {}};
  for (int v = 0; v < 256; ++v) grey.pixels.push_back(static_cast<uint8_t>(v));
  const Image8 mask = binarize_mask(grey);
  for (int v = 0; v < 256; ++v) {
    volatile float x = static_cast<float>(v) / 255.0f;
    EXPECT_EQ(mask.pixels[v], x >= 0.5f ? 1 : 0) << "grey " << v;
  }
}

// ---- bad input: one error naming the file ---------------------------------------------------

TEST(ImageFileErrors, MissingEmptyDirectoryAndForeignFiles) {
  const std::string missing = tmp().file("absent.png");
  EXPECT_EQ(error_of(missing), "'" + missing + "': not found");
  fs::create_directories(tmp().file("dir.png"));
  EXPECT_EQ(error_of(tmp().file("dir.png")), "'" + tmp().file("dir.png") + "': is a directory, not a file");
  const std::string empty = write_file("empty.png", {});
  EXPECT_EQ(error_of(empty), "'" + empty + "': empty file");
  const std::string text = write_file("notes.png", Bytes{'h', 'e', 'l', 'l', 'o', '\n'});
  EXPECT_EQ(error_of(text), "'" + text + "': not a PNG, JPEG or WebP image");
  try {
    read_image(missing);
  } catch (const Error& e) {
    EXPECT_STREQ(e.kind(), "UsageError");
  }
  try {
    read_image(text);
  } catch (const Error& e) {
    EXPECT_STREQ(e.kind(), "ImageError");
  }
}

TEST(ImageFileErrors, TruncatedFiles) {
  const Image8 im = noise_rgb(40, 30);
  const Bytes png = make_png(png_spec(40, 30, PNG_COLOR_TYPE_RGB, 8, samples_of(im)));
  for (size_t keep : {size_t{20}, png.size() / 2, png.size() - 20}) {  // in IHDR, in IDAT, in its last bytes
    const std::string p = write_file("cut.png", Bytes(png.begin(), png.begin() + keep));
    EXPECT_EQ(error_of(p), "'" + p + "': truncated PNG data") << keep << " of " << png.size() << " bytes";
  }
  const Bytes jpg = make_jpeg(64, 48, 3, JCS_RGB);
  for (size_t keep : {size_t{30}, jpg.size() / 2}) {
    const std::string p = write_file("cut.jpg", Bytes(jpg.begin(), jpg.begin() + keep));
    EXPECT_EQ(error_of(p), "'" + p + "': truncated JPEG data") << keep << " of " << jpg.size() << " bytes";
  }
  const Bytes webp = webp_lossless(im.pixels, 40, 30, 3);
  const std::string p = write_file("cut.webp", Bytes(webp.begin(), webp.begin() + webp.size() / 2));
  EXPECT_EQ(error_of(p), "'" + p + "': truncated WebP data");
}

// After the image data Pillow reads leniently: a file cut after IDAT (no IEND) loads.
TEST(ImageFileErrors, APngWithoutItsEndChunkLoads) {
  const Image8 im = noise_rgb(8, 8);
  const Bytes png = make_png(png_spec(8, 8, PNG_COLOR_TYPE_RGB, 8, samples_of(im)));
  EXPECT_EQ(compare_images(read_image(write_file("noiend.png", Bytes(png.begin(), png.end() - 12))), im), "identical");
}

TEST(ImageFileErrors, CorruptData) {
  Bytes png = make_png(png_spec(2, 2, PNG_COLOR_TYPE_GRAY, 8, {1, 2, 3, 4}));
  png[29] ^= 0xFF;  // IHDR's checksum
  const std::string p = write_file("crc.png", png);
  EXPECT_EQ(error_of(p), "'" + p + "': bad PNG data (libpng: IHDR: CRC error)");
  Bytes jpg = make_jpeg(8, 8, 3, JCS_RGB);
  const Bytes sof = {0xFF, 0xC0};
  const auto at = std::search(jpg.begin(), jpg.end(), sof.begin(), sof.end());
  ASSERT_NE(at, jpg.end());
  at[4] = 12;  // the sample precision
  const std::string j = write_file("precision.jpg", jpg);
  EXPECT_EQ(error_of(j), "'" + j + "': bad JPEG data (libjpeg: Unsupported JPEG data precision 12)");
  const Bytes two = make_jpeg(4, 4, 2, JCS_UNKNOWN);
  const std::string t = write_file("two.jpg", two);
  EXPECT_EQ(error_of(t), "'" + t + "': JPEG with 2 components is not supported (1, 3 or 4)");
}

TEST(ImageFileErrors, ImagesAboveTheSizeLimit) {
  const std::string limit = " pixels is larger than the limit of 16384 pixels per side and 2^28 pixels in all";
  const Bytes png =
      make_png(png_spec(kMaxImageSide + 1, 1, PNG_COLOR_TYPE_GRAY, 1, std::vector<int>(kMaxImageSide + 1)));
  const std::string p = write_file("wide.png", png);
  EXPECT_EQ(error_of(p), "'" + p + "': PNG image of 16385x1" + limit);
  const Bytes jpg = make_jpeg(8, kMaxImageSide + 8, 1, JCS_GRAYSCALE);
  const std::string j = write_file("tall.jpg", jpg);
  EXPECT_EQ(error_of(j), "'" + j + "': JPEG image of 8x16392" + limit);
}

}  // namespace
}  // namespace fluxmpi::io
