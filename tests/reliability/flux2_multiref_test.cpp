// Bad-input table, part 10: FLUX.2 multi-reference editing (docs/flux2.md, "Multi-reference
// editing"). More reference images than the model takes, references that are missing, cannot be
// decoded, are too small or too elongated for diffusers' processor, JSON Lines images whose
// references differ in size, several --image on a FLUX.1 model, and FLUX.1's other image inputs on
// a FLUX.2 model. Each is one line naming the flag or the file, the documented exit code on every
// rank, before anything heavy runs; nothing is left behind.

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "harness.h"
#include "support/fixtures.h"
#include "support/multiref_cases.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;

std::string reference(const std::string& name) {
  return (fs::path(test::project_subtree_dir(test::kMultirefSubtree)) / "inputs" / name).string();
}

// The FLUX.2 klein fixture as {f2}, the subtree's references copied in as {a}, {b}, {c}, {d}, and
// `edit` to break one thing.
auto with_references(std::function<void(Workspace&)> edit = {}) {
  return [=](Workspace& w) {
    w.define("f2", (fs::path(test::fixture_root()) / "flux2" / "tiny-flux2-klein").string());
    const std::pair<const char*, const char*> files[] = {
        {"a", "ref_a_80x64.png"}, {"b", "ref_b_72x100.png"}, {"c", "ref_c_112x64.png"}, {"d", "ref_d_96x80.jpg"}};
    for (const auto& [key, name] : files) {
      write_bytes(w.path(name), read_bytes(reference(name)));
      w.define(key, w.path(name));
    }
    // Two the processor refuses, made by the fixture generator.
    for (const auto& [key, name] : {std::pair<const char*, const char*>{"small", "refused_small_96x48.png"},
                                    {"wide", "refused_wide_600x70.png"}}) {
      write_bytes(w.path(name), read_bytes(reference(name)));
      w.define(key, w.path(name));
    }
    if (edit) edit(w);
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
      BadInput("multiref_too_many_references", kExitUsage, "UsageError",
               {"--image: 5 reference images, but FLUX.2 [klein] takes at most 4"})
          .setup(with_references())
          .args(with({"--image", "{a}", "--image", "{b}", "--image", "{c}", "--image", "{d}", "--image", "{a}"})),
      BadInput("multiref_too_many_references_np2", kExitUsage, "UsageError",
               {"--image: 5 reference images, but FLUX.2 [klein] takes at most 4"})
          .setup(with_references())
          .args(with({"--image", "{a}", "--image", "{b}", "--image", "{c}", "--image", "{d}", "--image", "{b}"}))
          .ranks(2),
      BadInput("multiref_reference_missing", kExitUsage, "UsageError", {"--image '{work}/no-such.png': not found"})
          .setup(with_references())
          .args(with({"--image", "{a}", "--image", "{work}/no-such.png"})),
      BadInput("multiref_reference_not_an_image", kExitBadInput, "ImageError",
               {"--image '{work}/notes.png': not a PNG, JPEG or WebP image"})
          .setup(with_references([](Workspace& w) { write_bytes(w.path("notes.png"), "these are notes, not pixels\n"); }))
          .args(with({"--image", "{a}", "--image", "{work}/notes.png"})),
      BadInput("multiref_reference_truncated", kExitBadInput, "ImageError", {"'{work}/cut.png': truncated PNG data"})
          .setup(with_references([](Workspace& w) {
            std::string bytes = read_bytes(reference("ref_b_72x100.png"));
            bytes.resize(bytes.size() / 2);
            write_bytes(w.path("cut.png"), bytes);
          }))
          .args(with({"--image", "{work}/cut.png", "--image", "{a}"}))
          .ranks(2),
      BadInput("multiref_reference_too_small", kExitBadInput, "ImageError",
               {"--image reference image 1 '{small}': 96x48 pixels; a FLUX.2 reference image must be at least 64 pixels"})
          .setup(with_references())
          .args(with({"--image", "{a}", "--image", "{small}"})),
      BadInput("multiref_reference_too_elongated", kExitBadInput, "ImageError",
               {"--image reference image 0 '{wide}': 600x70 pixels, an aspect ratio over 8:1"})
          .setup(with_references())
          .args(with({"--image", "{wide}"})),
      BadInput("multiref_lines_with_other_sizes", kExitUsage, "UsageError",
               {"line 2: reference image 0 '{c}' would be encoded at 112x64, the job's first image's at 80x64"})
          .setup(with_references([](Workspace& w) {
            std::ofstream(w.path("refs.jsonl")) << "{\"prompt\": \"a cat\", \"image\": [\"ref_a_80x64.png\"]}\n"
                                                << "{\"prompt\": \"a dog\", \"image\": [\"ref_c_112x64.png\"]}\n";
          }))
          .without({"--prompt"})
          .args(with({"--prompts-file", "{work}/refs.jsonl"})),
      BadInput("multiref_lines_with_other_counts", kExitUsage, "UsageError",
               {"line 2: 2 reference images, the job's first image has 1"})
          .setup(with_references([](Workspace& w) {
            std::ofstream(w.path("refs.jsonl")) << "{\"prompt\": \"a cat\", \"image\": \"ref_a_80x64.png\"}\n"
                                                << "{\"prompt\": \"a dog\", \"image\": [\"ref_a_80x64.png\", "
                                                   "\"ref_b_72x100.png\"]}\n";
          }))
          .without({"--prompt"})
          .args(with({"--prompts-file", "{work}/refs.jsonl"})),
      BadInput("multiref_several_images_on_flux1", kExitUsage, "UsageError",
               {"--image is given 2 times: several reference images are for FLUX.2 models"})
          .setup(with_references())
          .args({"--image", "{a}", "--image", "{b}"}),
      BadInput("multiref_image_list_on_flux1", kExitUsage, "UsageError",
               {"line 1: \"image\" lists 2 images: several reference images are for FLUX.2 models"})
          .setup(with_references([](Workspace& w) {
            std::ofstream(w.path("refs.jsonl")) << "{\"prompt\": \"a cat\", \"image\": [\"ref_a_80x64.png\", "
                                                   "\"ref_b_72x100.png\"]}\n";
          }))
          .without({"--prompt"})
          .args({"--prompts-file", "{work}/refs.jsonl"}),
      BadInput("multiref_mask_on_flux2", kExitUsage, "UsageError",
               {"--mask: FLUX.2 [klein] takes reference images (--image, repeatable) and no other image inputs"})
          .setup(with_references())
          .args(with({"--image", "{a}", "--mask", "{b}"})),
  };
}

class MultirefRows : public testing::TestWithParam<BadInput> {};
TEST_P(MultirefRows, FailsCleanly) { GetParam().check(); }
INSTANTIATE_TEST_SUITE_P(Table, MultirefRows, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
