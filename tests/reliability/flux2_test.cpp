// Bad-input table, part 9: FLUX.2 (docs/flux2.md). A FLUX.2 folder with a FLUX.1 component, a
// tokenizer.json that is not BPE, text-encoder layers beyond the encoder's depth or of the wrong
// count, and the FLUX.1-only options. Each is one line naming the culprit, on every rank, before
// any weight is loaded; nothing is left behind.

#include <filesystem>

#include "core/error.h"
#include "harness.h"
#include "support/fixtures.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;

// Copies a FLUX.2 fixture pipeline to W/f2 (named {f2}); `edit` breaks one thing in it.
auto with_flux2(const std::string& name, std::function<void(Workspace&, const std::string&)> edit = {}) {
  return [=](Workspace& w) {
    const std::string to = w.path("f2");
    copy_tree((fs::path(test::fixture_root()) / "flux2" / name).string(), to);
    w.define("f2", to);
    if (edit) edit(w, to);
  };
}

std::vector<BadInput> rows() {
  const std::vector<std::string> klein = {"--model", "{f2}", "--max-sequence-length", "32"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = klein;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  return {
      BadInput("flux2_with_flux1_vae", kExitBadInput, "ConfigError",
               {"{f2}': vae/config.json: '_class_name' is \"AutoencoderKL\", expected \"AutoencoderKLFlux2\""})
          .setup(with_flux2("tiny-flux2-klein", [](Workspace& w, const std::string& f2) {
            fs::remove_all(f2 + "/vae");
            copy_tree(w.model_file("vae"), f2 + "/vae");
          }))
          .args(klein),
      BadInput("flux2_with_flux1_transformer", kExitBadInput, "ConfigError",
               {"transformer/config.json: '_class_name' must be \"Flux2Transformer2DModel\" (a FLUX.2 transformer), got "
                "\"FluxTransformer2DModel\""})
          .setup(with_flux2("tiny-flux2-klein", [](Workspace& w, const std::string& f2) {
            fs::remove_all(f2 + "/transformer");
            copy_tree(w.model_file("transformer"), f2 + "/transformer");
          }))
          .args(klein),
      BadInput("flux2_text_encoder_of_the_other_kind", kExitBadInput, "ConfigError",
               {"text_encoder/config.json: 'architectures' \"Mistral3ForConditionalGeneration\" does not go with "
                "Flux2KleinPipeline"})
          .setup(with_flux2("tiny-flux2-klein", [](Workspace&, const std::string& f2) {
            fs::remove_all(f2 + "/text_encoder");
            copy_tree((fs::path(test::fixture_root()) / "flux2/tiny-flux2-dev/text_encoder").string(), f2 + "/text_encoder");
          }))
          .args(klein),
      BadInput("flux2_tokenizer_not_bpe", kExitBadInput, "TokenizerError", {"tokenizer.json: model type 'Unigram' is not BPE"})
          .setup(with_flux2("tiny-flux2-klein", [](Workspace&, const std::string& f2) {
            edit_json(f2 + "/tokenizer/tokenizer.json", [](nlohmann::ordered_json& j) { j["model"]["type"] = "Unigram"; });
          }))
          .args(klein),
      BadInput("flux2_layers_beyond_depth", kExitUsage, "UsageError",
               {"--text-encoder-layers: layer 37 is beyond the text encoder's 36 layers"})
          .setup(with_flux2("tiny-flux2-klein"))
          .args(with({"--text-encoder-layers", "9,18,37"})),
      BadInput("flux2_layers_wrong_count", kExitUsage, "UsageError",
               {"--text-encoder-layers: 2 layers of 32 features make 64 but", "joint_attention_dim is 96"})
          .setup(with_flux2("tiny-flux2-klein"))
          .args(with({"--text-encoder-layers", "9,18"})),
      BadInput("flux2_layers_malformed", kExitUsage, "UsageError",
               {"--text-encoder-layers must be comma-separated layer indices >= 0 (e.g. 9,18,27), got '9,x,27'"})
          .setup(with_flux2("tiny-flux2-klein"))
          .args(with({"--text-encoder-layers", "9,x,27"})),
      BadInput("flux2_with_control_image", kExitUsage, "UsageError",
               {"--control-image: FLUX.2 [klein] takes reference images (--image, repeatable) and no other image inputs"})
          .setup(with_flux2("tiny-flux2-klein", [](Workspace& w, const std::string&) {
            write_bytes(w.path("in.png"), read_bytes((fs::path(test::fixture_root()) / "image-inputs/inputs/photo_64x64.png").string()));
          }))
          .args(with({"--control-image", "{work}/in.png"})),
      BadInput("flux2_with_negative_prompt", kExitUsage, "UsageError",
               {"--negative-prompt: FLUX.2 [klein] base takes --guidance as diffusers' guidance_scale"})
          .setup(with_flux2("tiny-flux2-klein-base"))
          .args(with({"--negative-prompt", "blurry", "--guidance", "3"})),
      BadInput("flux2_truncated_transformer_shard", kExitBadInput, "WeightError", {"{f2}/transformer/"})
          .setup(with_flux2("tiny-flux2-dev", [](Workspace&, const std::string& f2) {
            for (const auto& e : fs::directory_iterator(f2 + "/transformer"))
              if (e.path().extension() == ".safetensors") {
                truncate_file(e.path().string(), fs::file_size(e.path()) - 100);
                break;
              }
          }))
          .args(klein),
  };
}

class Flux2Rows : public testing::TestWithParam<BadInput> {};
TEST_P(Flux2Rows, FailsCleanly) { GetParam().check(); }
INSTANTIATE_TEST_SUITE_P(Table, Flux2Rows, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
