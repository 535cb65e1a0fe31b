// Bad-input table, part 8: image inputs (docs/images.md). Missing, truncated and non-image files,
// inputs a mode cannot take, a strength out of range, a model folder that contradicts its
// transformer, and Kontext with --patches. Each is one line naming the culprit, on every rank,
// before anything heavy runs; nothing is left behind.

#include <filesystem>

#include "core/error.h"
#include "harness.h"
#include "support/fixtures.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;

std::string input_file(const std::string& name) {
  return (fs::path(test::fixture_root()) / "image-inputs" / "inputs" / name).string();
}
std::string image_model(const std::string& name) {
  return (fs::path(test::fixture_root()) / "image-inputs" / name).string();
}

// Copies a fixture input into the workspace (optionally cut short) and names it {img}.
auto with_image(const std::string& name, size_t keep = 0) {
  return [=](Workspace& w) {
    std::string bytes = read_bytes(input_file(name));
    if (keep > 0) bytes.resize(keep);
    write_bytes(w.path("in.png"), bytes);
    w.define("img", w.path("in.png"));
    w.define("fill", image_model("tiny-flux-fill"));
    w.define("control", image_model("tiny-flux-control"));
    w.define("kontext", image_model("tiny-flux-kontext"));
  };
}

std::vector<BadInput> rows() {
  return {
      BadInput("image_missing", kExitUsage, "UsageError", {"--image '{work}/no-such.png': not found"})
          .args({"--image", "{work}/no-such.png"}),
      BadInput("image_truncated", kExitBadInput, "ImageError", {"'{img}':"})
          .setup(with_image("photo_64x64.png", 200))
          .args({"--image", "{img}"}),
      BadInput("image_not_an_image", kExitBadInput, "ImageError", {"'{work}/in.png':"})
          .setup([](Workspace& w) { write_bytes(w.path("in.png"), "a photo of a cat\n"); })
          .args({"--image", "{work}/in.png"}),
      BadInput("mask_missing", kExitUsage, "UsageError", {"--mask '{work}/mask.png': not found"})
          .setup(with_image("photo_64x64.png"))
          .args({"--image", "{img}", "--mask", "{work}/mask.png"}),
      BadInput("mask_without_image", kExitUsage, "UsageError", {"--mask needs --image"})
          .setup(with_image("mask_ellipse_64x64.png"))
          .args({"--mask", "{img}"}),
      BadInput("strength_zero", kExitUsage, "UsageError", {"--strength must be in (0, 1]"})
          .setup(with_image("photo_64x64.png"))
          .args({"--image", "{img}", "--strength", "0"}),
      BadInput("strength_above_one", kExitUsage, "UsageError", {"--strength must be in (0, 1]", "got 1.5"})
          .setup(with_image("photo_64x64.png"))
          .args({"--image", "{img}", "--strength", "1.5"}),
      BadInput("strength_without_image", kExitUsage, "UsageError", {"--strength: a text2img job has no strength"})
          .args({"--strength", "0.5"}),
      BadInput("control_image_on_flux_model", kExitUsage, "UsageError", {"--control-image needs a FLUX.1 Control model"})
          .setup(with_image("control_edges_64x64.png"))
          .args({"--control-image", "{img}"}),
      BadInput("fill_model_without_mask", kExitUsage, "UsageError", {"needs --mask"})
          .setup(with_image("photo_64x64.png"))
          .args({"--model", "{fill}", "--image", "{img}"}),
      BadInput("control_model_given_image", kExitUsage, "UsageError", {"takes --control-image FILE"})
          .setup(with_image("photo_64x64.png"))
          .args({"--model", "{control}", "--image", "{img}"}),
      BadInput("class_contradicts_channels", kExitUsage, "UsageError",
               {"model_index.json says FluxFillPipeline", "in_channels is 64"})
          .setup([](Workspace& w) {
            edit_json(w.model_file("model_index.json"), [](auto& j) { j["_class_name"] = "FluxFillPipeline"; });
            with_image("photo_64x64.png")(w);
          })
          .args({"--image", "{img}", "--mask", "{img}"}),
      BadInput("kontext_with_patches", kExitUsage, "UsageError", {"--patches 2: a Kontext job with an --image runs exact steps only"})
          .setup(with_image("photo_72x56.png"))
          .args({"--model", "{kontext}", "--image", "{img}", "--patches", "2", "--max-area", "4096"}),
      BadInput("jsonl_missing_image", kExitUsage, "UsageError",
               {"prompts file '{work}/p.jsonl': line 2: '{work}/gone.png': not found"})
          .setup([](Workspace& w) {
            with_image("photo_64x64.png")(w);
            write_bytes(w.path("p.jsonl"), "{\"prompt\": \"a cat\", \"image\": \"in.png\"}\n"
                                           "{\"prompt\": \"a dog\", \"image\": \"gone.png\"}\n");
          })
          .args({"--prompts-file", "{work}/p.jsonl"})
          .without({"--prompt"}),
      BadInput("jsonl_line_of_another_mode", kExitUsage, "UsageError",
               {"prompts file '{work}/p.jsonl': line 2: has --mask but the job's first image has none"})
          .setup([](Workspace& w) {
            with_image("photo_64x64.png")(w);
            write_bytes(w.path("p.jsonl"), "{\"prompt\": \"a cat\", \"image\": \"in.png\"}\n"
                                           "{\"prompt\": \"a dog\", \"image\": \"in.png\", \"mask\": \"in.png\"}\n");
          })
          .args({"--prompts-file", "{work}/p.jsonl"})
          .without({"--prompt"}),
      BadInput("max_area_on_img2img", kExitUsage, "UsageError", {"--max-area: only Kontext jobs"})
          .setup(with_image("photo_64x64.png"))
          .args({"--image", "{img}", "--max-area", "4096"}),
  };
}

class ImageInputRows : public testing::TestWithParam<BadInput> {};
TEST_P(ImageInputRows, FailsCleanly) { GetParam().check(); }
INSTANTIATE_TEST_SUITE_P(Table, ImageInputRows, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
