// Flux2Transformer2DModel parity with diffusers 0.40 (flux2/ subtree): every transformer_forward
// case of flux2/manifest.json (klein, klein-base, dev with guidance) with every recorded
// intermediate at kTolFp32 (max |diff| <= 1e-5 * max(1, max |ref|)); the same forward split into
// parts chained through StreamState (cuts inside the double blocks, at their end, inside the
// single blocks, and three parts) bit-identical to the whole; a part without the embedders holds
// no modulation weights; the position ids against the pipeline cases' text_ids / latent_ids;
// bad configs and a FLUX.1 folder refused with one line naming the file and the field.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "models/flux2/transformer.h"
#include "support/fixtures.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::flux2 {
namespace {
namespace fs = std::filesystem;

using test::expect_close;
using test::expect_identical;
using test::kTolFp32;
using test::SubtreeCase;

std::vector<SubtreeCase> cases_of(const std::string& wanted) {
  return test::flux2_cases([wanted](const std::string& kind) { return kind == wanted; });
}

std::string transformer_dir(const SubtreeCase& c) { return (fs::path(c.model_dir) / "transformer").string(); }

Flux2Transformer load_part(const SubtreeCase& c, const TransformerPart& part, nn::LoadStats* stats = nullptr) {
  return load_flux2_transformer(transformer_dir(c), part, at::kFloat, test::test_device(), stats);
}

// The case's inputs; ids as diffusers uses them (row 0 of the batched ids).
struct Inputs {
  flux::TransformerInputs in;
  at::Tensor txt_ids, img_ids;
};
Inputs inputs_of(const test::CaseTensors& ref) {
  using test::on_test_device;
  Inputs x;
  x.in.latents = on_test_device(ref.get("in_hidden_states"));
  x.in.text = on_test_device(ref.get("in_encoder_hidden_states"));
  x.in.timestep = on_test_device(ref.get("in_timestep"));
  if (ref.has("in_guidance")) x.in.guidance = on_test_device(ref.get("in_guidance"));
  x.txt_ids = on_test_device(ref.get("in_txt_ids")[0]);
  x.img_ids = on_test_device(ref.get("in_img_ids")[0]);
  return x;
}

at::Tensor text_rows(const flux::StreamState& s) { return s.is_joint() ? s.joint.narrow(1, 0, s.text_len) : s.txt; }
at::Tensor image_rows(const flux::StreamState& s) {
  return s.is_joint() ? s.joint.narrow(1, s.text_len, s.joint.size(1) - s.text_len) : s.img;
}

class Flux2TransformerForward : public testing::TestWithParam<SubtreeCase> {};

TEST_P(Flux2TransformerForward, MatchesEveryIntermediate) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  Flux2Transformer model = load_part(c, whole_part(read_transformer_config(transformer_dir(c))));
  const Inputs x = inputs_of(ref);
  const std::string where = c.name + ": ";
  const int64_t D = model->stream_dim();
  EXPECT_EQ(model->config().guidance_embeds, ref.has("in_guidance")) << where << "guidance embedder vs case input";

  flux::StreamState s = model->embed(x.in);
  expect_close(where + "x_embedder_out", s.img, ref.get("x_embedder_out"), kTolFp32);
  expect_close(where + "context_embedder_out", s.txt, ref.get("context_embedder_out"), kTolFp32);
  expect_close(where + "temb", s.temb, ref.get("temb"), kTolFp32);
  ASSERT_EQ(s.modulation.size(1), 15 * D);
  expect_close(where + "double_stream_mod_img", s.modulation.narrow(1, 0, 6 * D), ref.get("double_stream_mod_img"),
               kTolFp32);
  expect_close(where + "double_stream_mod_txt", s.modulation.narrow(1, 6 * D, 6 * D), ref.get("double_stream_mod_txt"),
               kTolFp32);
  expect_close(where + "single_stream_mod", s.modulation.narrow(1, 12 * D, 3 * D), ref.get("single_stream_mod"),
               kTolFp32);

  const flux::RopeTables rope = model->rope(x.txt_ids, x.img_ids);
  const int64_t S = x.txt_ids.size(0), L = x.img_ids.size(0);
  expect_close(where + "rope_txt_cos", rope.cos.narrow(0, 0, S), ref.get("rope_txt_cos"), kTolFp32);
  expect_close(where + "rope_txt_sin", rope.sin.narrow(0, 0, S), ref.get("rope_txt_sin"), kTolFp32);
  expect_close(where + "rope_img_cos", rope.cos.narrow(0, S, L), ref.get("rope_img_cos"), kTolFp32);
  expect_close(where + "rope_img_sin", rope.sin.narrow(0, S, L), ref.get("rope_img_sin"), kTolFp32);

  int64_t observed = 0;
  model->run_blocks(s, rope, [&](const std::string& name, const flux::StreamState& st) {
    expect_close(where + name + "_txt", text_rows(st), ref.get(name + "_txt"), kTolFp32);
    expect_close(where + name + "_img", image_rows(st), ref.get(name + "_img"), kTolFp32);
    ++observed;
  });
  EXPECT_EQ(observed, model->config().num_blocks());
  at::Tensor normed;
  const at::Tensor out = model->final_layer(s, &normed);
  expect_close(where + "norm_out_out", normed, ref.get("norm_out_out"), kTolFp32);
  expect_close(where + "out_sample", out, ref.get("out_sample"), kTolFp32);
  expect_identical(where + "forward() = the stage calls", model->forward(x.in, x.txt_ids, x.img_ids), out);
}

// bf16 weights and activations (the CPU's one-pass LayerNorm-modulate kernel): a sanity bound,
// not a parity claim (tests/support/tensor_compare.h). As diffusers does, the timestep is cast to
// the run dtype before the x1000 (and the product rounds to bf16 too): that moves t * 1000 by up to
// ~4, which changes the fast sinusoid channels of temb entirely. So the reference is the fp32
// model (at parity above) given the timestep and guidance whose x1000 is the bf16 run's, and the
// bound measures bf16 arithmetic only.
TEST_P(Flux2TransformerForward, Bf16WithinSanityBound) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const std::string dir = transformer_dir(c);
  const TransformerPart whole = whole_part(read_transformer_config(dir));
  Inputs x = inputs_of(ref);
  const auto bf16_rounded = [](const at::Tensor& t) {
    return t.defined() ? (t.to(at::kBFloat16) * 1000).to(at::kFloat) / 1000 : t;
  };
  x.in.timestep = bf16_rounded(x.in.timestep);
  x.in.guidance = bf16_rounded(x.in.guidance);
  const at::Tensor expected = load_part(c, whole)->forward(x.in, x.txt_ids, x.img_ids).cpu();
  Flux2Transformer model = load_flux2_transformer(dir, whole, at::kBFloat16, test::test_device());
  x.in.latents = x.in.latents.to(at::kBFloat16);
  x.in.text = x.in.text.to(at::kBFloat16);
  const at::Tensor out = model->forward(x.in, x.txt_ids, x.img_ids);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  expect_close(c.name + ": out_sample (bf16 run vs fp32 run, same rounded timestep)", out, expected,
               test::kTolBf16Sanity);
}

// The widths the step loop sizes its messages and outputs with.
TEST_P(Flux2TransformerForward, StageWidths) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fs::path(transformer_dir(c)) / "config.json"));
  const int64_t D = cfg.at("num_attention_heads").get<int64_t>() * cfg.at("attention_head_dim").get<int64_t>();
  const TransformerConfig config = read_transformer_config(transformer_dir(c));
  Flux2Transformer model(config, whole_part(config));
  EXPECT_EQ(model->stream_dim(), D);
  EXPECT_EQ(model->modulation_dim(), 15 * D);
  EXPECT_EQ(model->output_channels(), cfg.at("in_channels").get<int64_t>());  // out_channels: null
  EXPECT_EQ(config.mlp_hidden_dim(), 3 * D);                                    // mlp_ratio 3.0
}

// The state after one part, as the next rank receives it: fresh tensors, no shared storage.
flux::StreamState as_received(const flux::StreamState& s) {
  flux::StreamState r;
  const auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
  r.txt = copy(s.txt);
  r.img = copy(s.img);
  r.joint = copy(s.joint);
  r.temb = copy(s.temb);
  r.modulation = copy(s.modulation);
  r.text_len = s.text_len;
  return r;
}

bool is_global_embedder_key(const std::string& key) {
  for (const char* p : {"x_embedder.", "context_embedder.", "time_guidance_embed.", "double_stream_modulation_img.",
                        "double_stream_modulation_txt.", "single_stream_modulation."})
    if (key.rfind(p, 0) == 0) return true;
  return false;
}

// Split runs: the parts chained through StreamState give the whole model's output bit for bit,
// and each part holds exactly its own weights under their global names.
TEST_P(Flux2TransformerForward, SplitIntoPartsIsBitIdentical) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const TransformerConfig config = read_transformer_config(transformer_dir(c));
  const int64_t Ld = config.num_layers, B = config.num_blocks();
  ASSERT_GE(Ld, 2) << "the fixture needs a cut inside the double blocks";
  ASSERT_GE(config.num_single_layers, 2) << "the fixture needs a cut inside the single blocks";
  const Inputs x = inputs_of(ref);
  Flux2Transformer whole = load_part(c, whole_part(config));
  const at::Tensor expected = whole->forward(x.in, x.txt_ids, x.img_ids);

  const std::vector<std::pair<std::string, std::vector<int64_t>>> splits = {
      {"inside the double blocks", {0, 1, B}},
      {"at the double/single boundary", {0, Ld, B}},
      {"inside the single blocks", {0, Ld + 1, B}},
      {"three parts", {0, 1, Ld + 1, B}},
  };
  for (const auto& [label, cuts] : splits) {
    const std::string where = c.name + " split " + label + ": ";
    flux::StreamState s;
    at::Tensor out;
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      const TransformerPart part{cuts[p], cuts[p + 1], p == 0, p + 2 == cuts.size()};
      nn::LoadStats stats;
      Flux2Transformer model = load_part(c, part, &stats);
      int64_t own_keys = 0;
      for (const auto& item : model->named_parameters()) {
        EXPECT_TRUE(model->owns_key(item.key())) << where << item.key() << " built outside its part";
        if (!part.embedders) EXPECT_FALSE(is_global_embedder_key(item.key())) << where << item.key();
        ++own_keys;
      }
      EXPECT_EQ(stats.tensors, own_keys) << where << "part " << p;
      if (!part.embedders) {
        EXPECT_FALSE(model->double_stream_modulation_img) << where << "part " << p;
        EXPECT_FALSE(model->single_stream_modulation) << where << "part " << p;
      }
      EXPECT_EQ(model->modulation_dim(), whole->modulation_dim());
      if (part.embedders) s = model->embed(x.in);
      model->run_blocks(s, model->rope(x.txt_ids, x.img_ids));
      if (part.final_layer) out = model->final_layer(s);
      else s = as_received(s);
    }
    expect_identical(where + "out_sample", out, expected);
  }
}

// Patch pipelining's caches: the whole sequence through caches (an exact step that fills them)
// is bit-identical to no cache, and a later window of the image tokens attending to the filled
// caches reproduces the rows of the whole run for the first block (its inputs are exact there).
TEST_P(Flux2TransformerForward, KvCacheWindow) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const TransformerConfig config = read_transformer_config(transformer_dir(c));
  Flux2Transformer model = load_part(c, whole_part(config));
  const Inputs x = inputs_of(ref);
  const flux::RopeTables rope = model->rope(x.txt_ids, x.img_ids);
  const int64_t S = x.txt_ids.size(0), L = x.img_ids.size(0), N = S + L;
  flux::StreamState plain = model->embed(x.in);
  flux::StreamState cached = as_received(plain);
  model->run_blocks(plain, rope);
  std::vector<flux::KvCache> kv = model->kv_caches(x.in.latents.size(0), N, x.in.latents.options());
  model->run_blocks(cached, rope, {}, &kv);
  expect_identical(c.name + ": joint stream through filled caches", cached.joint, plain.joint);

  // The first double block alone on the last image tokens, keys of the other rows from the cache.
  flux::StreamState first = model->embed(x.in);
  const int64_t w = L / 2, D = config.inner_dim();
  flux::KvCache& cache = kv[0];
  cache.offset = S + (L - w);
  flux::RopeTables window{rope.cos.narrow(0, S + L - w, w), rope.sin.narrow(0, S + L - w, w)};
  auto [t0, i0] = model->double_blocks[0]->forward(first.txt, first.img, first.modulation.narrow(1, 0, 6 * D),
                                                   first.modulation.narrow(1, 6 * D, 6 * D), rope);
  auto [tw, iw] = model->double_blocks[0]->forward(first.txt.narrow(1, 0, 0), first.img.narrow(1, L - w, w),
                                                   first.modulation.narrow(1, 0, 6 * D),
                                                   first.modulation.narrow(1, 6 * D, 6 * D), window, &cache);
  EXPECT_EQ(tw.size(1), 0);
  expect_close(c.name + ": double_block_0_img window rows from the cache", iw, i0.narrow(1, L - w, w), kTolFp32);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2TransformerForward, testing::ValuesIn(cases_of("transformer_forward")),
                         test::image_case_name);

// Pipeline cases: the position ids the pipelines build from the size alone.
class Flux2PipelineCase : public testing::TestWithParam<SubtreeCase> {};

TEST_P(Flux2PipelineCase, PositionIdsFromSize) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const TransformerConfig config = read_transformer_config(transformer_dir(c));
  Flux2Transformer model(config, TransformerPart{0, 0, false, false});
  const auto hw = c.json.at("latent_hw");
  const at::Tensor latent_ids = ref.get("latent_ids"), text_ids = ref.get("text_ids");
  expect_identical(c.name + ": latent_ids[0]",
                   model->image_position_ids(hw[0].get<int64_t>(), hw[1].get<int64_t>()), latent_ids[0]);
  expect_identical(c.name + ": text_ids[0]", model->text_position_ids(text_ids.size(1)), text_ids[0]);
}

// Every transformer call of every pipeline case, each from its own stored inputs (so errors do not
// accumulate across steps): step k sees latents_initial (k = 0) or latents_steps[k-1]; with CFG
// (klein base) both the conditional and the unconditional ('' prompt) outputs.
TEST_P(Flux2PipelineCase, NoisePredictionOfEveryStep) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  c10::InferenceMode guard;
  using test::on_test_device;
  test::CaseTensors ref(c.file);
  const std::string dir = transformer_dir(c);
  static std::map<std::string, Flux2Transformer> models;
  auto it = models.find(dir);
  if (it == models.end()) it = models.emplace(dir, load_part(c, whole_part(read_transformer_config(dir)))).first;
  const Flux2Transformer& model = it->second;
  const bool cfg = ref.has("noise_pred_cond");
  const at::Tensor cond_ref = ref.get(cfg ? "noise_pred_cond" : "noise_pred");  // [N, n, L, C]
  const at::Tensor steps = on_test_device(ref.get("latents_steps"));
  const at::Tensor timestep = on_test_device(ref.get("transformer_timestep"));  // [N, n]
  const flux::RopeTables rope = model->rope(on_test_device(ref.get("text_ids")[0]), on_test_device(ref.get("latent_ids")[0]));
  flux::TransformerInputs in;
  if (model->config().guidance_embeds) in.guidance = on_test_device(ref.get("guidance"));
  for (int64_t k = 0; k < cond_ref.size(0); ++k) {
    in.latents = k == 0 ? on_test_device(ref.get("latents_initial")) : steps[k - 1];
    in.timestep = timestep[k];
    const std::string step = "[" + std::to_string(k) + "]";
    in.text = on_test_device(ref.get("prompt_embeds"));
    flux::StreamState s = model->embed(in);
    model->run_blocks(s, rope);
    expect_close(c.name + ": " + (cfg ? "noise_pred_cond" : "noise_pred") + step, model->final_layer(s), cond_ref[k],
                 kTolFp32);
    if (!cfg) continue;
    in.text = on_test_device(ref.get("negative_prompt_embeds"));
    s = model->embed(in);
    model->run_blocks(s, rope);
    expect_close(c.name + ": noise_pred_uncond" + step, model->final_layer(s), ref.get("noise_pred_uncond")[k], kTolFp32);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2PipelineCase, testing::ValuesIn(cases_of("pipeline")), test::image_case_name);

// ---------------------------------------------------------------------------------------------
// Bad input: one line naming the file and the field.

class Flux2TransformerConfigErrors : public testing::Test {
 protected:
  void SetUp() override {
    FLUXMPI_REQUIRE_FIXTURES();
    source_ = (fs::path(test::flux2_subtree()) / "tiny-flux2-klein" / "transformer").string();
    if (!fs::is_directory(source_)) GTEST_SKIP() << "no " << source_;
    dir_ = fs::temp_directory_path() /
           ("fluxmpi-flux2-config-" + std::to_string(::getpid()) + "-" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // Writes the klein config changed by `edit` into the scratch folder.
  std::string write_config(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(fs::path(source_) / "config.json"));
    edit(j);
    std::ofstream(dir_ / "config.json") << j.dump(2);
    return dir_.string();
  }
  // The ConfigError message of reading `dir`'s config (empty when it does not throw one).
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return {};
  }
  static void expect_one_line_naming(const std::string& message, const std::string& file, const std::string& field) {
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find("'" + field + "'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    std::cout << "[ message  ] " << message << "\n";
  }
  std::string source_;
  fs::path dir_;
};

TEST_F(Flux2TransformerConfigErrors, TheFixtureConfigsParse) {
  for (const char* p : {"tiny-flux2-klein", "tiny-flux2-klein-base", "tiny-flux2-dev"}) {
    const TransformerConfig c = read_transformer_config((fs::path(test::flux2_subtree()) / p / "transformer").string());
    EXPECT_EQ(c.out_channels, c.in_channels) << p << ": out_channels null -> in_channels";
    EXPECT_EQ(c.axes_dims_rope.size(), 4u) << p;
    EXPECT_EQ(c.rope_theta, 2000.0) << p;
    EXPECT_EQ(c.guidance_embeds, std::string(p) == "tiny-flux2-dev") << p;
  }
}

TEST_F(Flux2TransformerConfigErrors, MissingFieldIsNamed) {
  for (const char* field : {"num_layers", "mlp_ratio", "axes_dims_rope", "rope_theta", "guidance_embeds"}) {
    const std::string dir = write_config([field](nlohmann::json& j) { j.erase(field); });
    expect_one_line_naming(error_of([&] { read_transformer_config(dir); }), dir + "': config.json", field);
  }
}

TEST_F(Flux2TransformerConfigErrors, BadFieldIsNamed) {
  std::string dir = write_config([](nlohmann::json& j) { j["axes_dims_rope"] = {4, 6, 6, 6}; });
  expect_one_line_naming(error_of([&] { read_transformer_config(dir); }), "config.json", "axes_dims_rope");
  dir = write_config([](nlohmann::json& j) { j["axes_dims_rope"] = {8, 8, 8}; });
  expect_one_line_naming(error_of([&] { read_transformer_config(dir); }), "config.json", "axes_dims_rope");
  dir = write_config([](nlohmann::json& j) { j["num_attention_heads"] = "2"; });
  expect_one_line_naming(error_of([&] { read_transformer_config(dir); }), "config.json", "num_attention_heads");
}

TEST_F(Flux2TransformerConfigErrors, Flux1FolderIsRefused) {
  const std::string flux1 = (fs::path(test::fixture_root()) / "tiny-flux-dev" / "transformer").string();
  if (!fs::is_directory(flux1)) GTEST_SKIP() << "no " << flux1;
  const std::string message = error_of([&] {
    load_flux2_transformer(flux1, TransformerPart{0, 1, true, false}, at::kFloat, at::kCPU);
  });
  expect_one_line_naming(message, flux1, "_class_name");
  EXPECT_NE(message.find("FluxTransformer2DModel"), std::string::npos) << message;
}

}  // namespace
}  // namespace fluxmpi::flux2
