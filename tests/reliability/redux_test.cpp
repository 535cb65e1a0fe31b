// Bad-input table, part 11: FLUX.1 Redux (docs/redux.md). A Redux folder that is missing, not a
// Redux folder, missing a component, with configs that disagree or are for another FLUX, with a
// weight missing or of the wrong shape; a reference image that is missing or cannot be decoded;
// Redux options without --redux-model, scales that do not match the images, true CFG, a FLUX.2
// model. Each is one line naming the culprit, on every rank, before anything heavy; nothing left.

#include <filesystem>

#include "core/error.h"
#include "harness.h"
#include "safetensors_edit.h"
#include "support/fixtures.h"
#include "support/subtree_cases.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;

std::string redux_subtree() { return test::project_subtree_dir("redux"); }

// A writable copy of the fixture's Redux folder as {work}/redux, and a reference image as
// {work}/ref.png; `edit` breaks one thing in the copy.
auto with_redux(std::function<void(Workspace&)> edit = {}) {
  return [edit](Workspace& w) {
    copy_tree(redux_subtree() + "/tiny-flux-redux", w.path("redux"));
    write_bytes(w.path("ref.png"), read_bytes(redux_subtree() + "/inputs/photo_100x75.png"));
    w.define("redux", w.path("redux"));
    w.define("ref", w.path("ref.png"));
    if (edit) edit(w);
  };
}

// Rewrites the image encoder's weights, changed by `edit`.
auto edit_encoder(std::function<void(SafetensorsBytes&)> edit) {
  return with_redux([edit](Workspace& w) {
    const std::string file = w.path("redux/image_encoder/model.safetensors");
    SafetensorsBytes st = SafetensorsBytes::read(file);
    edit(st);
    st.write(file);
    w.define("weights", file);
  });
}

const std::vector<std::string> kRedux = {"--redux-model", "{redux}", "--redux-image", "{ref}"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::vector<BadInput> rows() {
  const std::string fc1 = "vision_model.encoder.layers.0.mlp.fc1.weight";
  return {
      BadInput("redux_model_missing", kExitUsage, "UsageError", {"--redux-model '{work}/none': not found"})
          .setup(with_redux())
          .args({"--redux-model", "{work}/none", "--redux-image", "{ref}"}),
      BadInput("redux_model_is_a_flux_pipeline", kExitBadInput, "ConfigError",
               {"model_index.json: '_class_name' must be \"FluxPriorReduxPipeline\""})
          .setup(with_redux())
          .args({"--redux-model", "{model}", "--redux-image", "{ref}"}),
      BadInput("redux_component_missing", kExitBadInput, "ConfigError",
               {"redux dir '{redux}': image_embedder/config.json: file not found"})
          .setup(with_redux([](Workspace& w) { fs::remove_all(w.path("redux/image_embedder")); }))
          .args(kRedux),
      BadInput("redux_configs_disagree", kExitBadInput, "ConfigError",
               {"image_embedder/config.json: 'redux_dim' (48) must equal the image encoder's hidden_size"})
          .setup(with_redux([](Workspace& w) {
            edit_json(w.path("redux/image_embedder/config.json"), [](auto& j) { j["redux_dim"] = 48; });
          }))
          .args(kRedux),
      BadInput("redux_processor_size_off_the_patches", kExitBadInput, "ConfigError",
               {"preprocessor_config.json: 'size'", "patches of 14 pixels, but the image encoder has 16 positions"})
          .setup(with_redux([](Workspace& w) {
            edit_json(w.path("redux/feature_extractor/preprocessor_config.json"),
                      [](auto& j) { j["size"] = {{"height", 90}, {"width", 60}}; });
          }))
          .args(kRedux),
      BadInput("redux_for_another_flux", kExitBadInput, "ConfigError",
               {"image_embedder/config.json: 'txt_in_features' is 48, but the transformer reads text tokens of 32"})
          .setup(with_redux([](Workspace& w) {
            edit_json(w.path("redux/image_embedder/config.json"), [](auto& j) { j["txt_in_features"] = 48; });
          }))
          .args(kRedux),
      BadInput("redux_weight_missing", kExitBadInput, "WeightError", {fc1})
          .setup(edit_encoder([fc1](SafetensorsBytes& st) { st.remove(fc1); }))
          .args(kRedux),
      BadInput("redux_weight_wrong_shape", kExitBadInput, "WeightError", {fc1, "41"})
          .setup(edit_encoder([fc1](SafetensorsBytes& st) {
            st.remove(fc1);
            st.append(fc1, "F32", {41, 24}, std::string(41 * 24 * 4, '\0'));
          }))
          .args(kRedux),
      BadInput("redux_image_missing", kExitUsage, "UsageError", {"--redux-image '{work}/no-such.png': not found"})
          .setup(with_redux())
          .args({"--redux-model", "{redux}", "--redux-image", "{work}/no-such.png"}),
      BadInput("redux_image_undecodable", kExitBadInput, "ImageError", {"--redux-image '{work}/bad.png':"})
          .setup(with_redux([](Workspace& w) { write_bytes(w.path("bad.png"), "not an image at all\n"); }))
          .args({"--redux-model", "{redux}", "--redux-image", "{work}/bad.png"}),
      BadInput("redux_image_undecodable_two_ranks", kExitBadInput, "ImageError", {"--redux-image '{work}/bad.png':"})
          .setup(with_redux([](Workspace& w) { write_bytes(w.path("bad.png"), std::string("\x89PNG\r\n\x1a\n", 8)); }))
          .args({"--redux-model", "{redux}", "--redux-image", "{work}/bad.png"})
          .ranks(2),
      BadInput("redux_image_without_model", kExitUsage, "UsageError", {"--redux-image needs --redux-model"})
          .setup(with_redux())
          .args({"--redux-image", "{ref}"}),
      BadInput("redux_model_without_image", kExitUsage, "UsageError", {"--redux-model needs at least one --redux-image"})
          .setup(with_redux())
          .args({"--redux-model", "{redux}"}),
      BadInput("redux_scales_for_other_image_count", kExitUsage, "UsageError",
               {"--redux-prompt-scale gives 3 scales for 2 --redux-image"})
          .setup(with_redux())
          .args(with(kRedux, {"--redux-image", "{ref}", "--redux-prompt-scale", "1,0.5,0.2"})),
      BadInput("redux_scale_not_a_number", kExitUsage, "UsageError", {"--redux-pooled-scale must be a number"})
          .setup(with_redux())
          .args(with(kRedux, {"--redux-pooled-scale", "half"})),
      BadInput("redux_with_true_cfg", kExitUsage, "UsageError", {"--true-cfg: a FLUX.1 Redux job has no negative side"})
          .setup(with_redux())
          .args(with(kRedux, {"--true-cfg", "2", "--negative-prompt", "blurry"})),
      BadInput("redux_on_flux2", kExitUsage, "UsageError", {"--redux-model: FLUX.1 Redux is an adapter of FLUX.1 models"})
          .setup(with_redux([](Workspace& w) { w.define("flux2", test::fixture_root() + "/flux2/tiny-flux2-klein"); }))
          .args(with(kRedux, {"--model", "{flux2}"})),
  };
}

class ReduxRows : public testing::TestWithParam<BadInput> {};
TEST_P(ReduxRows, FailsCleanly) { GetParam().check(); }
INSTANTIATE_TEST_SUITE_P(Table, ReduxRows, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
