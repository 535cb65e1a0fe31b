// Single-file layouts, torch-free: what detect_components finds in each community file of the
// fixtures, the presented stores against the diffusers folder byte for byte (the LDM VAE and the
// original transformer are fp32 in both), presented tensors made of row runs, and the errors of
// the mapping (unknown keys, blocks that skip a number, rows that do not fit the config).

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "core/error.h"
#include "io/model_dir.h"
#include "io/safetensors_writer.h"
#include "io/single_file.h"
#include "support/fixtures.h"

namespace fluxmpi::io {
namespace {
namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return test::fixture_root() + "/single-file/tiny-flux-dev/" + name; }

std::string detected(const std::string& path) {
  SafetensorsFile f(path);
  std::string s;
  for (const auto& c : detect_components(f.header()))
    s += std::string(s.empty() ? "" : "; ") + component_name(c.component) + ": " + describe_layout(c);
  return s;
}

#define REQUIRE_SINGLE_FILE_FIXTURES()                                                          \
  do {                                                                                         \
    if (!test::single_file_fixtures_present()) {                                               \
      if (test::running_in_ci()) FAIL() << "single-file fixtures not found under " << test::fixture_root(); \
      GTEST_SKIP() << "single-file fixtures not found under " << test::fixture_root();        \
    }                                                                                          \
  } while (0)

TEST(SingleFile, DetectsEveryComponentOfTheFixtures) {
  REQUIRE_SINGLE_FILE_FIXTURES();
  EXPECT_EQ(detected(fixture("flux1-tiny-dev.safetensors")), "transformer: original FLUX keys");
  EXPECT_EQ(detected(fixture("ae.safetensors")), "vae: LDM keys");
  EXPECT_EQ(detected(fixture("clip_l.safetensors")), "text_encoder: transformers keys");
  EXPECT_EQ(detected(fixture("t5xxl.safetensors")), "text_encoder_2: transformers keys");
  EXPECT_EQ(detected(fixture("flux1-tiny-dev-fp8-all.safetensors")),
            "transformer: original FLUX keys under 'model.diffusion_model.'; vae: LDM keys under 'vae.'; "
            "text_encoder: transformers keys under 'text_encoders.clip_l.transformer.'; "
            "text_encoder_2: transformers keys under 'text_encoders.t5xxl.transformer.'");
  // A diffusers folder's own files are diffusers layouts.
  EXPECT_EQ(detected(test::fixture_root() + "/tiny-flux-dev/vae/diffusion_pytorch_model.safetensors"), "vae: diffusers keys");
}

// Every tensor of the folder's component, as the file presents it, byte for byte.
void expect_same_bytes(const TensorStore& file, const TensorStore& folder, const std::string& skip_prefix) {
  for (const auto& key : folder.keys()) {
    if (!skip_prefix.empty() && key.rfind(skip_prefix, 0) == 0) continue;
    ASSERT_TRUE(file.contains(key)) << key;
    TensorView a = file.get(key), b = folder.get(key);
    EXPECT_EQ(a.entry->shape, b.entry->shape) << key;
    ASSERT_EQ(a.entry->dtype, b.entry->dtype) << key;
    std::vector<uint8_t> bytes;
    for (const auto& p : a.pieces) bytes.insert(bytes.end(), p.data(), p.data() + p.num_bytes());
    ASSERT_EQ(bytes.size(), b.entry->num_bytes()) << key;
    EXPECT_EQ(std::memcmp(bytes.data(), b.data(), bytes.size()), 0) << key << " (stored as " << file.stored_as(key) << ")";
  }
}

TEST(SingleFile, PresentedStoresHoldTheFolderWeights) {
  REQUIRE_SINGLE_FILE_FIXTURES();
  ModelSources s;
  s.model = fixture("flux1-tiny-dev.safetensors");
  s.vae = fixture("ae.safetensors");
  s.model_config = test::fixture_root() + "/tiny-flux-dev";
  ModelDir single(s);
  ModelDir folder(test::fixture_root() + "/tiny-flux-dev");
  expect_same_bytes(single.open_weights("transformer"), folder.open_weights("transformer"), "");
  // The decoder, mapped from the LDM names (the encoder is not mapped: fluxmpi never runs it).
  expect_same_bytes(single.open_weights("vae"), folder.open_weights("vae"), "encoder.");
  TensorStore vae = single.open_weights("vae");
  EXPECT_EQ(vae.get("decoder.mid_block.attentions.0.to_q.weight").entry->shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(vae.stored_as("decoder.up_blocks.0.resnets.0.conv1.weight"), "'decoder.up.3.block.0.conv1.weight'");
  TensorStore t = single.open_weights("transformer");
  EXPECT_EQ(t.stored_as("transformer_blocks.1.attn.to_k.bias"), "rows [32, 64) of 'double_blocks.1.img_attn.qkv.bias'");
  EXPECT_EQ(t.stored_as("norm_out.linear.weight"),
            "rows [32, 64) of 'final_layer.adaLN_modulation.1.weight' + rows [0, 32) of 'final_layer.adaLN_modulation.1.weight'");
  EXPECT_NO_THROW(check_transformer_shapes(t, single.transformer_config()));
  EXPECT_NE(single.describe_sources().find("vae:            " + fs::absolute(fixture("ae.safetensors")).lexically_normal().string() +
                                           " (LDM keys)"),
            std::string::npos)
      << single.describe_sources();
}

// A small original-layout file written from the tiny fixture with one change.
std::string write_changed(const std::string& name, const std::function<std::string(const std::string&)>& rename) {
  SafetensorsFile src(fixture("flux1-tiny-dev.safetensors"));
  SafetensorsWriter w;
  for (const auto& e : src.header().tensors) {
    const std::string to = rename(e.name);
    if (!to.empty()) w.add(to, e.dtype, e.shape, src.data(e), e.num_bytes());
  }
  const std::string path = (fs::temp_directory_path() / name).string();
  w.write(path);
  return path;
}

std::string open_error(const std::string& path, const std::string& config_dir) {
  try {
    ModelSources s;
    s.model = path;
    s.model_config = config_dir;
    ModelDir dir(s);
    dir.open_weights("transformer");
  } catch (const WeightError& e) {
    return e.what();
  }
  return "(no WeightError)";
}

TEST(SingleFile, MappingErrorsNameTheKey) {
  REQUIRE_SINGLE_FILE_FIXTURES();
  const std::string config = test::fixture_root() + "/tiny-flux-dev";
  const std::string gap = write_changed("fluxmpi-sf-gap.safetensors", [](const std::string& n) {
    return n.rfind("double_blocks.1.", 0) == 0 ? "double_blocks.2." + n.substr(16) : n;
  });
  EXPECT_NE(open_error(gap, config).find("the blocks skip a number: no tensor 'double_blocks.1.*' between double_blocks.0 and "
                                         "double_blocks.2"),
            std::string::npos)
      << open_error(gap, config);
  const std::string odd = write_changed("fluxmpi-sf-odd.safetensors", [](const std::string& n) {
    return n == "img_in.bias" ? std::string("img_in.gamma") : n;
  });
  EXPECT_NE(open_error(odd, config).find("unexpected tensor 'img_in.gamma': not a key of the original FLUX transformer layout"),
            std::string::npos)
      << open_error(odd, config);
  const std::string missing = write_changed("fluxmpi-sf-missing.safetensors", [](const std::string& n) {
    return n == "single_blocks.2.linear2.weight" ? std::string() : n;
  });
  // The presented key 'single_transformer_blocks.2.proj_out.weight' has no source: the shape check names it.
  ModelSources s;
  s.model = missing;
  s.model_config = config;
  ModelDir dir(s);
  TensorStore store = dir.open_weights("transformer");
  try {
    check_transformer_shapes(store, dir.transformer_config());
    ADD_FAILURE() << "no error for a missing tensor";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'single_transformer_blocks.2.proj_out.weight' not found (expected shape [32, 160])"),
              std::string::npos)
        << e.what();
  }
  for (const auto& p : {gap, odd, missing}) fs::remove(p);
}

TEST(SingleFile, PresentedRowsAreChecked) {
  SafetensorsWriter w;
  std::vector<float> data(12, 1.0f);
  w.add("a", DType::F32, {4, 3}, data.data(), data.size() * 4);
  const std::string path = (fs::temp_directory_path() / "fluxmpi-sf-rows.safetensors").string();
  w.write(path);
  auto file = std::make_shared<SafetensorsFile>(path);
  TensorStore ok = TensorStore::open_presented(file, "t", {{"x", {{"a", 2, 4}, {"a", 0, 2}}, {}}, {"y", {{"a", 0, -1}}, {12}}});
  EXPECT_EQ(ok.get("x").entry->shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(ok.get("x").pieces.size(), 2u);
  EXPECT_FALSE(ok.get("x").stored_as_is());
  EXPECT_EQ(ok.get("y").entry->shape, (std::vector<int64_t>{12}));
  EXPECT_THROW(TensorStore::open_presented(file, "t", {{"x", {{"a", 3, 5}}, {}}}), WeightError);
  EXPECT_THROW(TensorStore::open_presented(file, "t", {{"x", {{"b", 0, -1}}, {}}}), WeightError);
  EXPECT_THROW(TensorStore::open_presented(file, "t", {{"x", {{"a", 0, -1}}, {5, 2}}}), WeightError);
  fs::remove(path);
}

}  // namespace
}  // namespace fluxmpi::io
