// Parity of FLUX.2's text encoders (Qwen3 for klein, the Mistral3 text tower for dev) with the
// flux2/ fixtures (../shared/fixtures/flux2, diffusers 0.40 + torch 2.6 SDPA): every recorded
// hidden_state_{k} of the text_encoder_forward(_nopad) cases and the stacked default layers, the
// prompt states and embeds of every pipeline case from its recorded ids and mask (a layer-limited
// load), all in fp32 at kTolFp32 on test::test_device(); layer-range parts chained bit-identical to
// the whole; the loader reading only what it builds, both Mistral3 key layouts, unclaimed keys;
// bad layer lists and configs.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors_writer.h"
#include "io/tensor_store.h"
#include "models/llm/text_encoder.h"
#include "support/fixtures.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::llm {
namespace {
namespace fs = std::filesystem;

using test::expect_close;
using test::expect_identical;
using test::SubtreeCase;

std::string encoder_dir(const SubtreeCase& c) { return c.model_dir + "/text_encoder"; }

std::vector<int64_t> every_state(const DecoderConfig& config) {
  std::vector<int64_t> all;
  for (int64_t k = 0; k <= config.num_hidden_layers; ++k) all.push_back(k);
  return all;
}

std::vector<SubtreeCase> forward_cases() {
  return test::flux2_cases(
      [](const std::string& kind) { return kind == "text_encoder_forward" || kind == "text_encoder_forward_nopad"; });
}
std::vector<SubtreeCase> padded_forward_cases() {
  return test::flux2_cases([](const std::string& kind) { return kind == "text_encoder_forward"; });
}
std::vector<SubtreeCase> pipeline_cases() {
  return test::flux2_cases([](const std::string& kind) { return kind == "pipeline"; });
}

// Tensors per layer as stored: q/k/v/o, gate/up/down, two norms, and Qwen3's q_norm/k_norm.
int64_t tensors_per_layer(const DecoderConfig& c) { return 9 + (c.qk_norm ? 2 : 0); }

// The message of the fluxmpi error `fn` throws (fails the test when it throws none or another type).
template <typename E, typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no exception";
  return {};
}

// A scratch folder removed at the end of the test.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("fluxmpi-llm-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

class TextEncoderForward : public testing::TestWithParam<SubtreeCase> {};

TEST_P(TextEncoderForward, EveryHiddenStateAndStackedDefaultsFp32) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const DecoderConfig config = read_decoder_config(encoder_dir(c));
  const std::vector<int64_t> all = every_state(config);
  TextDecoder model = load_text_encoder(encoder_dir(c), all, at::kFloat, test::test_device());
  ASSERT_EQ(static_cast<int64_t>(model->layers.size()), config.num_hidden_layers);

  test::CaseTensors tensors(c.file);
  const at::Tensor ids = test::on_test_device(tensors.get("in_input_ids"));
  const at::Tensor mask = test::on_test_device(tensors.get("in_attention_mask"));
  const PartOutput out = model->run_layers(model->embed(ids), mask, all);
  const auto& listed = c.json.at("tensors");
  for (int64_t k : all) {
    const std::string name = "hidden_state_" + std::to_string(k);
    ASSERT_TRUE(listed.contains(name)) << c.name << ": records no " << name;
    ASSERT_EQ(out.collected.count(k), 1u) << name << " not collected";
    expect_close(c.name + " " + name, out.collected.at(k), tensors.get(name), test::kTolFp32);
  }

  // The default layers from a load that builds only the layers they need.
  const std::vector<int64_t> defaults = default_out_layers(config.architecture);
  TextDecoder limited = load_text_encoder(encoder_dir(c), {}, at::kFloat, test::test_device());
  EXPECT_EQ(static_cast<int64_t>(limited->layers.size()), defaults.back());
  EXPECT_TRUE(limited->norm.is_empty());
  std::vector<at::Tensor> ref;
  for (int64_t k : defaults) ref.push_back(tensors.get("hidden_state_" + std::to_string(k)));
  expect_close(c.name + " stacked default layers [B, S, 3H]", limited->encode(ids, mask, defaults), at::cat(ref, -1),
               test::kTolFp32);

  if (c.kind == "text_encoder_forward_nopad") {
    // All ones is no padding: the same causal attention as no mask at all.
    ASSERT_TRUE(tensors.get("in_attention_mask").eq(1).all().item<bool>()) << c.name << ": the nopad mask has pads";
    const PartOutput unmasked = model->run_layers(model->embed(ids), at::Tensor(), all);
    expect_identical(c.name + " hidden_state_" + std::to_string(config.num_hidden_layers) + " without a mask",
                     unmasked.collected.at(config.num_hidden_layers), out.collected.at(config.num_hidden_layers));
  }
}

INSTANTIATE_TEST_SUITE_P(Flux2, TextEncoderForward, testing::ValuesIn(forward_cases()), test::image_case_name);

// The text half of a pipeline case: prompt (and, with CFG, negative) ids and mask -> the stacked
// states [B, n, S, H] and the embeds [B * images, S, n * H] for the case's text_encoder_out_layers.
class TextEncoderPipeline : public testing::TestWithParam<SubtreeCase> {};

TEST_P(TextEncoderPipeline, PromptStatesAndEmbedsFromRecordedIdsFp32) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const std::vector<int64_t> layers = c.json.at("text_encoder_out_layers").get<std::vector<int64_t>>();
  const DecoderConfig config = read_decoder_config(encoder_dir(c));
  nn::LoadStats stats;
  TextDecoder model = load_text_encoder(encoder_dir(c), layers, at::kFloat, test::test_device(), &stats);
  const int64_t deepest = *std::max_element(layers.begin(), layers.end());
  const bool normed = deepest == config.num_hidden_layers;
  EXPECT_EQ(static_cast<int64_t>(model->layers.size()), deepest) << c.name << ": layers built";
  EXPECT_EQ(!model->norm.is_empty(), normed) << c.name << ": final norm built";
  EXPECT_EQ(stats.tensors, 1 + deepest * tensors_per_layer(config) + (normed ? 1 : 0)) << c.name << ": tensors loaded";

  test::CaseTensors tensors(c.file);
  for (const std::string branch : {"prompt", "negative"}) {
    const std::string ids_name = branch == "prompt" ? "prompt_input_ids" : "negative_input_ids";
    if (!tensors.has(ids_name)) {
      ASSERT_NE(branch, "prompt") << c.name << ": records no prompt_input_ids";
      continue;
    }
    const at::Tensor ids = test::on_test_device(tensors.get(ids_name));
    const at::Tensor mask = test::on_test_device(tensors.get(branch + "_attention_mask"));
    const PartOutput out = model->run_layers(model->embed(ids), mask, layers);
    std::vector<at::Tensor> slots;
    for (int64_t k : layers) slots.push_back(out.collected.at(k));
    expect_close(c.name + " " + branch + "_hidden_states_stacked", at::stack(slots, 1),
                 tensors.get(branch + "_hidden_states_stacked"), test::kTolFp32);
    const std::string embeds_name = branch == "prompt" ? "prompt_embeds" : "negative_prompt_embeds";
    const at::Tensor ref = tensors.get(embeds_name);
    ASSERT_EQ(ref.size(0) % ids.size(0), 0) << c.name << ": " << embeds_name << " rows are not a multiple of prompts";
    // The pipeline repeats each prompt's embeds for its images, prompt-major.
    expect_close(c.name + " " + embeds_name,
                 model->encode(ids, mask, layers).repeat_interleave(ref.size(0) / ids.size(0), 0), ref, test::kTolFp32);
  }
}

INSTANTIATE_TEST_SUITE_P(Flux2, TextEncoderPipeline, testing::ValuesIn(pipeline_cases()), test::image_case_name);

// Parts [0, cut) and [cut, N) chained against the whole, cut after the first layer, inside and
// before the last layer (whose part also holds the final norm).
class TextEncoderSplit : public testing::TestWithParam<SubtreeCase> {};

TEST_P(TextEncoderSplit, ChainedPartsAreBitIdenticalToTheWhole) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const std::string dir = encoder_dir(c);
  const DecoderConfig config = read_decoder_config(dir);
  const int64_t N = config.num_hidden_layers;
  const std::vector<int64_t> all = every_state(config);
  const DecoderPart whole_part = DecoderPart::for_out_layers(config, all);
  io::TensorStore store = io::TensorStore::open_dir(dir, "text encoder '" + dir + "'");
  TextDecoder whole = load_text_decoder(config, store, whole_part, at::kFloat, test::test_device());

  test::CaseTensors tensors(c.file);
  const at::Tensor ids = test::on_test_device(tensors.get("in_input_ids"));
  const at::Tensor mask = test::on_test_device(tensors.get("in_attention_mask"));
  const PartOutput ref = whole->run_layers(whole->embed(ids), mask, all);

  for (int64_t cut : {int64_t{1}, N / 3, N / 2 + 1, N - 1}) {
    SCOPED_TRACE("cut at layer " + std::to_string(cut));
    TextDecoder first = load_text_decoder(config, store, whole_part.slice(0, cut), at::kFloat, test::test_device());
    TextDecoder second = load_text_decoder(config, store, whole_part.slice(cut, N), at::kFloat, test::test_device());
    EXPECT_TRUE(first->norm.is_empty());
    EXPECT_TRUE(second->embed_tokens.is_empty());
    const PartOutput a = first->run_layers(first->embed(ids), mask, all);
    const PartOutput b = second->run_layers(a.hidden, mask, all);
    // Each part collects exactly the states it produces: 0..cut and cut+1..N.
    EXPECT_EQ(static_cast<int64_t>(a.collected.size()), cut + 1);
    EXPECT_EQ(static_cast<int64_t>(b.collected.size()), N - cut);
    HiddenStates merged = a.collected;
    merged.insert(b.collected.begin(), b.collected.end());
    for (int64_t k : all) {
      ASSERT_EQ(merged.count(k), 1u) << "hidden state " << k << " not produced";
      expect_identical(c.name + " split at " + std::to_string(cut) + " hidden_state_" + std::to_string(k),
                       merged.at(k), ref.collected.at(k));
    }
    const std::vector<int64_t> defaults = default_out_layers(config.architecture);
    expect_identical(c.name + " split at " + std::to_string(cut) + " stacked defaults",
                     stack_hidden_states(merged, defaults), stack_hidden_states(ref.collected, defaults));
  }
}

INSTANTIATE_TEST_SUITE_P(Flux2, TextEncoderSplit, testing::ValuesIn(padded_forward_cases()), test::image_case_name);

// A copy of the encoder in which every key the default load must not read (layers at and past
// the deepest default, the final norm, the lm_head, the vision tower and projector) is assigned by
// the index to a shard that is not a safetensors file, and the others are rewritten into a shard of
// their own: mapping the trap fails, so the default load succeeds only if it reads none of those
// keys. Loading the final norm from the same copy must fail, which shows the trap works.
class TextEncoderLoader : public testing::TestWithParam<SubtreeCase> {};

TEST_P(TextEncoderLoader, ReadsOnlyTheBuiltLayers) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const std::string dir = encoder_dir(c);
  const DecoderConfig config = read_decoder_config(dir);
  const std::vector<int64_t> defaults = default_out_layers(config.architecture);
  const int64_t deepest = defaults.back();

  ScratchDir scratch(std::string(architecture_name(config.architecture)));
  fs::copy_file(dir + "/config.json", scratch.path() / "config.json");
  std::ofstream(scratch.path() / "trap.safetensors") << "not a safetensors file";
  io::TensorStore original = io::TensorStore::open_dir(dir, "text encoder '" + dir + "'");
  io::SafetensorsWriter needed_shard;
  nlohmann::json map = nlohmann::json::object();
  int64_t trapped = 0, vision = 0;
  const std::string prefix = config.architecture == Architecture::Qwen3 ? "model." : "language_model.model.";
  for (const std::string& key : original.keys()) {
    bool needed = key == prefix + "embed_tokens.weight";
    for (int64_t g = 0; g < deepest; ++g)
      if (key.rfind(prefix + "layers." + std::to_string(g) + ".", 0) == 0) needed = true;
    if (needed) {
      const io::TensorView view = original.get(key);
      needed_shard.add(key, view.entry->dtype, view.entry->shape, view.data(), view.entry->num_bytes());
      map[key] = "needed.safetensors";
    } else {
      map[key] = "trap.safetensors";
      ++trapped;
      if (key.rfind("vision_tower.", 0) == 0 || key.rfind("multi_modal_projector.", 0) == 0) ++vision;
    }
  }
  needed_shard.write((scratch.path() / "needed.safetensors").string());
  std::ofstream(scratch.path() / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  EXPECT_GT(trapped, 0);
  if (config.architecture == Architecture::Mistral3) EXPECT_GT(vision, 0) << "the dev checkpoint holds a vision tower";

  nn::LoadStats stats;
  TextDecoder model = load_text_encoder(scratch.path().string(), defaults, at::kFloat, at::kCPU, &stats);
  const int64_t expected = 1 + deepest * tensors_per_layer(config);
  EXPECT_EQ(stats.tensors, expected) << "tensors loaded for " << deepest << " layers + embeddings";
  EXPECT_EQ(static_cast<int64_t>(model->named_parameters().size()), expected);
  std::printf("[ measured ] %s: %lld tensors loaded for %lld of %lld layers, %lld keys trapped (%lld vision)\n",
              c.name.c_str(), static_cast<long long>(stats.tensors), static_cast<long long>(deepest),
              static_cast<long long>(config.num_hidden_layers), static_cast<long long>(trapped),
              static_cast<long long>(vision));

  const std::string trap = error_of<WeightError>(
      [&] { load_text_encoder(scratch.path().string(), {config.num_hidden_layers}, at::kFloat, at::kCPU); });
  EXPECT_NE(trap.find("trap.safetensors"), std::string::npos) << trap;
}

INSTANTIATE_TEST_SUITE_P(Flux2, TextEncoderLoader, testing::ValuesIn(padded_forward_cases()), test::image_case_name);

// Writes every tensor of the encoder in `dir`, its key changed by `rename`, plus `extra` keys
// (4 fp32 zeros each), as one model.safetensors next to a copy of config.json in `out`.
void write_single_file_copy(const std::string& dir, const fs::path& out,
                            const std::function<std::string(const std::string&)>& rename,
                            const std::vector<std::string>& extra = {}) {
  fs::copy_file(dir + "/config.json", out / "config.json");
  io::TensorStore original = io::TensorStore::open_dir(dir, "text encoder '" + dir + "'");
  io::SafetensorsWriter writer;
  for (const std::string& key : original.keys()) {
    const io::TensorView view = original.get(key);
    writer.add(rename(key), view.entry->dtype, view.entry->shape, view.data(), view.entry->num_bytes());
  }
  const float zeros[4] = {0, 0, 0, 0};
  for (const std::string& key : extra) writer.add(key, io::DType::F32, {4}, zeros, sizeof zeros);
  writer.write((out / "model.safetensors").string());
}

// transformers >= 4.52 saves Mistral3 as model.language_model.*, model.vision_tower.*,
// model.multi_modal_projector.*, lm_head.*: the same weights under those keys give the same bits.
TEST(TextEncoderLayouts, NewerMistral3KeysLoadTheSameWeights) {
  const std::vector<SubtreeCase> cases = padded_forward_cases();
  REQUIRE_FLUX2_CASE(cases.front());
  auto dev = std::find_if(cases.begin(), cases.end(), [](const SubtreeCase& c) {
    return !c.name.empty() && read_decoder_config(encoder_dir(c)).architecture == Architecture::Mistral3;
  });
  ASSERT_TRUE(dev != cases.end()) << "no Mistral3 text_encoder_forward case";
  const SubtreeCase& c = *dev;
  ScratchDir scratch("mistral3-layout");
  write_single_file_copy(encoder_dir(c), scratch.path(), [](const std::string& key) {
    for (const auto& [old_prefix, new_prefix] :
         std::vector<std::pair<std::string, std::string>>{{"language_model.model.", "model.language_model."},
                                                          {"language_model.lm_head.", "lm_head."},
                                                          {"vision_tower.", "model.vision_tower."},
                                                          {"multi_modal_projector.", "model.multi_modal_projector."}})
      if (key.rfind(old_prefix, 0) == 0) return new_prefix + key.substr(old_prefix.size());
    ADD_FAILURE() << "unexpected key " << key;
    return key;
  });
  const std::vector<int64_t> layers = {10, 20, 40};
  TextDecoder legacy = load_text_encoder(encoder_dir(c), layers, at::kFloat, at::kCPU);
  nn::LoadStats stats;
  TextDecoder newer = load_text_encoder(scratch.path().string(), layers, at::kFloat, at::kCPU, &stats);
  EXPECT_EQ(stats.tensors, 2 + 40 * tensors_per_layer(legacy->config()));
  test::CaseTensors tensors(c.file);
  const at::Tensor ids = tensors.get("in_input_ids"), mask = tensors.get("in_attention_mask");
  expect_identical(c.name + " layers 10, 20, 40 from model.language_model.* keys", newer->encode(ids, mask, layers),
                   legacy->encode(ids, mask, layers));
}

// A key of the text tower inside the built range that no parameter claims is an error naming it;
// the same key in a layer the load does not build is not this load's concern.
TEST(TextEncoderLayouts, UnclaimedKeyInTheBuiltRangeIsAnError) {
  const std::vector<SubtreeCase> cases = padded_forward_cases();
  REQUIRE_FLUX2_CASE(cases.front());
  auto klein = std::find_if(cases.begin(), cases.end(), [](const SubtreeCase& c) {
    return !c.name.empty() && read_decoder_config(encoder_dir(c)).architecture == Architecture::Qwen3;
  });
  ASSERT_TRUE(klein != cases.end()) << "no Qwen3 text_encoder_forward case";
  ScratchDir scratch("qwen3-stray");
  write_single_file_copy(encoder_dir(*klein), scratch.path(), [](const std::string& key) { return key; },
                         {"model.layers.3.self_attn.q_proj.bias", "model.layers.30.self_attn.q_proj.bias"});
  const std::string dir = scratch.path().string();
  const std::string msg = error_of<WeightError>([&] { load_text_encoder(dir, {9, 18, 27}, at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find("'model.layers.3.self_attn.q_proj.bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no parameter of the model claims it"), std::string::npos) << msg;
  // Layers 0..1 only: both stray keys are outside the part.
  EXPECT_NO_THROW(load_text_encoder(dir, {2}, at::kFloat, at::kCPU));
}

TEST(TextEncoderBadInput, LayerBeyondTheDepthNamesItAndTheDepth) {
  const SubtreeCase c = padded_forward_cases().front();
  REQUIRE_FLUX2_CASE(c);
  const DecoderConfig config = read_decoder_config(encoder_dir(c));
  const int64_t beyond = config.num_hidden_layers + 1;
  const std::string msg = error_of<ConfigError>(
      [&] { load_text_encoder(encoder_dir(c), {9, beyond}, at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find("layer " + std::to_string(beyond)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(config.num_hidden_layers) + " layers"), std::string::npos) << msg;
  EXPECT_FALSE(error_of<ConfigError>([&] { DecoderPart::for_out_layers(config, {-1}); }).empty());
}

// Each fixture config with one field removed or spoiled: one ConfigError naming the file and the field.
TEST(TextEncoderBadInput, ConfigMissingOrBadFieldNamesFileAndField) {
  FLUXMPI_REQUIRE_FIXTURES();
  struct Spoil {
    std::string pipeline, pointer, expect;  // the field as a JSON pointer; a null value removes it
    nlohmann::json value;
  };
  const std::vector<Spoil> spoils = {
      {"tiny-flux2-klein", "/head_dim", "'head_dim' is missing", nullptr},
      {"tiny-flux2-klein", "/rms_norm_eps", "'rms_norm_eps' is missing", nullptr},
      {"tiny-flux2-klein", "/num_key_value_heads", "'num_key_value_heads' must be a positive integer", "2"},
      {"tiny-flux2-klein", "/num_key_value_heads", "'num_key_value_heads' (3) must divide", 3},
      {"tiny-flux2-dev", "/text_config/num_hidden_layers", "'text_config.num_hidden_layers' is missing", nullptr},
      {"tiny-flux2-dev", "/text_config/hidden_act", "'text_config.hidden_act' must be \"silu\"", "gelu"},
      {"tiny-flux2-dev", "/text_config", "'text_config' is missing", nullptr},
  };
  for (const Spoil& s : spoils) {
    const std::string path = test::flux2_subtree() + "/" + s.pipeline + "/text_encoder/config.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    const nlohmann::json::json_pointer ptr(s.pointer);
    if (s.value.is_null())
      j[ptr.parent_pointer()].erase(ptr.back());
    else
      j[ptr] = s.value;
    const std::string msg =
        error_of<ConfigError>([&] { parse_decoder_config(io::ConfigReader::from_text(j.dump(), path)); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(s.expect), std::string::npos) << "expected \"" << s.expect << "\" in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
  // The untouched configs parse to the fixture's architectures.
  const DecoderConfig klein = read_decoder_config(test::flux2_subtree() + "/tiny-flux2-klein/text_encoder");
  EXPECT_EQ(klein.architecture, Architecture::Qwen3);
  EXPECT_EQ(klein.head_dim, 16);
  EXPECT_TRUE(klein.qk_norm);
  const DecoderConfig dev = read_decoder_config(test::flux2_subtree() + "/tiny-flux2-dev/text_encoder");
  EXPECT_EQ(dev.architecture, Architecture::Mistral3);
  EXPECT_EQ(dev.num_hidden_layers, 40);
  EXPECT_DOUBLE_EQ(dev.rope_theta, 1e9);
  EXPECT_FALSE(dev.qk_norm);
}

}  // namespace
}  // namespace fluxmpi::llm
