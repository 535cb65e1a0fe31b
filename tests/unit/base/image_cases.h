#pragma once
// The image arguments of the image-inputs fixture cases (<fixtures>/image-inputs/manifest.json),
// shared by image_file_test and image_resize_test.

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/image_file.h"
#include "io/safetensors.h"
#include "support/fixtures.h"

namespace fluxmpi::test {

/// One image argument of one case: the file a user passes and the tensors that record it.
struct ImageArg {
  std::string name;           ///< gtest name, e.g. "tiny_flux_dev__inpaint_b__mask"
  std::string file;           ///< the input file (absolute)
  std::string tensors;        ///< the case's safetensors file (absolute)
  std::string input;          ///< [n, Hi, Wi, 3] uint8: what load_image returns
  int index = 0;              ///< which of the n images
  std::string resized;        ///< [n, H, W, 3] uint8 after the LANCZOS resize; empty when not resized
  std::string preprocessed;   ///< [n, C, H, W] float32 from the processor; empty when not recorded
  bool mask = false;          ///< preprocessed is a binarised mask [n, 1, H, W]
};

inline std::string image_inputs_dir() { return fixture_root() + "/image-inputs"; }
inline std::string image_inputs_manifest() { return image_inputs_dir() + "/manifest.json"; }

/// Every image argument of every case; one placeholder (empty name) without the fixture tree.
inline std::vector<ImageArg> image_args() {
  std::ifstream in(image_inputs_manifest());
  if (!in) return {ImageArg{}};
  const nlohmann::json m = nlohmann::json::parse(in);
  const std::string dir = image_inputs_dir() + "/";
  auto gtest_name = [](std::string s) {
    for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return s;
  };
  std::vector<ImageArg> out;
  for (const auto& [pipeline, p] : m["pipelines"].items()) {
    for (const auto& c : p["cases"]) {
      const std::string tensors = dir + c["file"].get<std::string>();
      const std::string base = gtest_name(pipeline + "__" + c["name"].get<std::string>());
      if (c.contains("input_images") && c["input_images"].is_object()) {
        for (const auto& [arg, info] : c["input_images"].items()) {
          const std::string x = arg == "mask_image" ? "mask" : arg;
          ImageArg a;
          a.name = base + "__" + x;
          a.file = dir + info["file"].get<std::string>();
          a.tensors = tensors;
          a.input = x + "_input_uint8";
          if (info["resized_to_hw"].is_array()) a.resized = x + "_resized_uint8";
          a.mask = x == "mask";
          const std::string pre = a.mask ? "mask_processed" : x + "_preprocessed";
          if (c["tensors"].contains(pre)) a.preprocessed = pre;
          out.push_back(a);
        }
      } else if (c.contains("call") && c["call"].contains("images")) {  // vae_encode: a batch
        int k = 0;
        for (const auto& f : c["call"]["images"]) {
          ImageArg a;
          a.name = base + "__image" + std::to_string(k);
          a.file = dir + f.get<std::string>();
          a.tensors = tensors;
          a.input = "in_image_uint8";
          a.index = k++;
          if (c["tensors"].contains("in_x")) a.preprocessed = "in_x";
          out.push_back(a);
        }
      }
    }
  }
  if (out.empty()) out.push_back(ImageArg{});
  return out;
}

inline std::string image_arg_name(const testing::TestParamInfo<ImageArg>& info) {
  return info.param.name.empty() ? "no_fixtures" : info.param.name;
}

inline void PrintTo(const ImageArg& a, std::ostream* os) { *os << (a.name.empty() ? "no fixtures" : a.name); }

/// Image `index` of a [n, H, W, 3] uint8 tensor as an RGB image.
inline io::Image8 fixture_image(const io::SafetensorsFile& f, const std::string& name, int index) {
  const io::TensorEntry* e = f.find(name);
  if (e == nullptr) throw std::runtime_error("'" + f.path() + "' has no tensor '" + name + "'");
  if (e->dtype != io::DType::U8 || e->shape.size() != 4 || e->shape[3] != 3 || index >= e->shape[0]) {
    throw std::runtime_error("'" + f.path() + "': tensor '" + name + "' is not [n, H, W, 3] uint8");
  }
  io::Image8 im{static_cast<int>(e->shape[2]), static_cast<int>(e->shape[1]), 3, {}};
  const size_t n = static_cast<size_t>(im.width) * im.height * 3;
  const uint8_t* p = f.data(*e) + n * index;
  im.pixels.assign(p, p + n);
  return im;
}

/// "identical" or "<what>: N of M samples differ, max |diff| D at (y, x, c)" for failure messages.
inline std::string compare_images(const io::Image8& got, const io::Image8& want) {
  if (got.width != want.width || got.height != want.height || got.channels != want.channels) {
    return "shape " + std::to_string(got.height) + "x" + std::to_string(got.width) + "x" +
           std::to_string(got.channels) + " != expected " + std::to_string(want.height) + "x" +
           std::to_string(want.width) + "x" + std::to_string(want.channels);
  }
  size_t differ = 0, worst = 0;
  int max_diff = 0;
  for (size_t i = 0; i < got.pixels.size(); ++i) {
    const int d = std::abs(int{got.pixels[i]} - int{want.pixels[i]});
    if (d == 0) continue;
    ++differ;
    if (d > max_diff) {
      max_diff = d;
      worst = i;
    }
  }
  if (differ == 0) return "identical";
  const size_t px = worst / got.channels;
  return std::to_string(differ) + " of " + std::to_string(got.pixels.size()) + " samples differ, max |diff| " +
         std::to_string(max_diff) + " at (y " + std::to_string(px / got.width) + ", x " +
         std::to_string(px % got.width) + ", c " + std::to_string(worst % got.channels) + ")";
}

}  // namespace fluxmpi::test

/// First statement of a test on the image-inputs fixtures: skips (fails under CI=true) without them.
#define FLUXMPI_REQUIRE_IMAGE_CASE(a)                                                      \
  do {                                                                                     \
    FLUXMPI_REQUIRE_ASSET(::fluxmpi::test::image_inputs_manifest(), "image-inputs fixtures"); \
    ASSERT_FALSE((a).name.empty()) << "no image argument in the image-inputs manifest";    \
  } while (0)
