// Bad-input table, part 10: ControlNets (docs/controlnet.md). A ControlNet whose config does not
// fit the transformer (width, block counts) or whose weights do not fit its config, a control mode
// out of range or missing for a Union model, ControlNet flags without --controlnet, missing and
// undecodable control images, nets that cannot run together, an --image beside --controlnet. Each
// is one line naming the culprit, on every rank, before anything heavy runs; nothing is left behind.

#include <filesystem>

#include "core/error.h"
#include "harness.h"
#include "support/subtree_cases.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;

std::string fixture(const std::string& relative) {
  return (fs::path(test::project_subtree_dir("controlnet")) / relative).string();
}

// Copies the fixture ControlNet `name` into the workspace as {cn} (edited by `edit`), and a control
// image as {img} (its first `keep` bytes when > 0).
auto with_net(const std::string& name, const std::function<void(nlohmann::ordered_json&)>& edit = {}, size_t keep = 0) {
  return [=](Workspace& w) {
    copy_tree(fixture(name), w.path("cn"));
    if (edit) edit_json(w.path("cn/config.json"), edit);
    w.define("cn", w.path("cn"));
    std::string bytes = read_bytes(fixture("inputs/edges_64x64.png"));
    if (keep > 0) bytes.resize(keep);
    write_bytes(w.path("edges.png"), bytes);
    w.define("img", w.path("edges.png"));
    w.define("union", fixture("tiny-controlnet-union"));
    w.define("xlabs", fixture("tiny-controlnet-xlabs"));
  };
}

std::vector<BadInput> rows() {
  return {
      BadInput("controlnet_width_mismatch", kExitBadInput, "ConfigError",
               {"--controlnet '{cn}'", "does not fit the transformer", "4 x 16 = 64"})
          .setup(with_net("tiny-controlnet-plain", [](auto& j) { j["num_attention_heads"] = 4; }))
          .args({"--controlnet", "{cn}", "--control-image", "{img}"})
          .ranks(2),
      BadInput("controlnet_blocks_mismatch", kExitBadInput, "ConfigError",
               {"--controlnet '{cn}'", "'num_single_layers' 4 does not fit the transformer", "is 3"})
          .setup(with_net("tiny-controlnet-plain", [](auto& j) { j["num_single_layers"] = 4; }))
          .args({"--controlnet", "{cn}", "--control-image", "{img}"})
          .ranks(2),
      BadInput("controlnet_weights_mismatch", kExitBadInput, "WeightError",
               {"--controlnet '{cn}'", "single_blocks.1.", "no parameter of the model claims it"})
          .setup(with_net("tiny-controlnet-plain", [](auto& j) { j["num_single_layers"] = 1; }))
          .args({"--controlnet", "{cn}", "--control-image", "{img}"}),
      BadInput("controlnet_not_a_controlnet", kExitBadInput, "ConfigError",
               {"--controlnet '{cn}': config.json: '_class_name' must be \"FluxControlNetModel\""})
          .setup(with_net("tiny-controlnet-plain", [](auto& j) { j["_class_name"] = "ControlNetModel"; }))
          .args({"--controlnet", "{cn}", "--control-image", "{img}"}),
      BadInput("controlnet_folder_missing", kExitUsage, "UsageError", {"--controlnet '{work}/none': not found"})
          .args({"--controlnet", "{work}/none", "--control-image", "{work}/none.png"}),
      BadInput("control_mode_out_of_range", kExitUsage, "UsageError",
               {"--control-mode 4 is out of range for the Union ControlNet '{union}'", "modes 0 to 3"})
          .setup(with_net("tiny-controlnet-plain"))
          .args({"--controlnet", "{union}", "--control-image", "{img}", "--control-mode", "4"})
          .ranks(2),
      BadInput("control_mode_missing_for_union", kExitUsage, "UsageError",
               {"--control-mode is needed for control image '{img}'", "Union ControlNet"})
          .setup(with_net("tiny-controlnet-plain"))
          .args({"--controlnet", "{union}", "--control-image", "{img}"}),
      BadInput("control_mode_without_controlnet", kExitUsage, "UsageError",
               {"--control-mode needs --controlnet DIR"})
          .args({"--control-mode", "1"}),
      BadInput("controlnet_scale_without_controlnet", kExitUsage, "UsageError",
               {"--controlnet-scale needs --controlnet DIR"})
          .args({"--controlnet-scale", "0.5"}),
      BadInput("control_guidance_window_empty", kExitUsage, "UsageError",
               {"--control-guidance-start 0.8 and --control-guidance-end 0.5", "need 0 <= start < end <= 1"})
          .setup(with_net("tiny-controlnet-plain"))
          .args({"--controlnet", "{cn}", "--control-image", "{img}", "--control-guidance-start", "0.8",
                 "--control-guidance-end", "0.5"}),
      BadInput("control_image_missing", kExitUsage, "UsageError", {"--control-image '{work}/gone.png': not found"})
          .setup(with_net("tiny-controlnet-plain"))
          .args({"--controlnet", "{cn}", "--control-image", "{work}/gone.png"}),
      BadInput("control_image_undecodable", kExitBadInput, "ImageError", {"--control-image", "'{img}':"})
          .setup(with_net("tiny-controlnet-plain", {}, 200))
          .args({"--controlnet", "{cn}", "--control-image", "{img}"})
          .ranks(2),
      BadInput("controlnet_without_control_image", kExitUsage, "UsageError", {"--controlnet needs --control-image FILE"})
          .setup(with_net("tiny-controlnet-plain"))
          .args({"--controlnet", "{cn}"}),
      BadInput("controlnets_of_two_layouts", kExitBadInput, "ConfigError",
               {"ControlNets of different layouts cannot run together"})
          .setup(with_net("tiny-controlnet-plain"))
          .args({"--controlnet", "{cn}", "--controlnet", "{xlabs}", "--control-image", "{img}", "--control-image", "{img}"}),
      BadInput("controlnet_with_image", kExitUsage, "UsageError", {"--image: --controlnet runs text-to-image"})
          .setup(with_net("tiny-controlnet-plain"))
          .args({"--controlnet", "{cn}", "--control-image", "{img}", "--image", "{img}"}),
  };
}

class ControlNetRows : public testing::TestWithParam<BadInput> {};
TEST_P(ControlNetRows, FailsCleanly) { GetParam().check(); }
INSTANTIATE_TEST_SUITE_P(Table, ControlNetRows, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
