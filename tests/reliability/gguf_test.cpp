// Bad-input table, part 10: GGUF transformers (--gguf FILE, or a .gguf given as --transformer).
// Each row copies the tiny FLUX.1 GGUF of the project fixtures (tests/fixtures/gguf) into the
// workspace, breaks one thing in it and runs fluxmpi with the workspace's pipeline as --model (its
// transformer config replaced by the GGUF model's): a truncated file, a bad magic or version, a
// tensor whose offset runs past the end, an unknown quantization type, a tensor list that does not
// match the config. One line naming the file and the tensor, the documented exit code, nothing
// written.

#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "harness.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Setup = std::function<void(Workspace&)>;

std::string fixture(const std::string& name) {
  return (fs::path(FLUXMPI_SOURCE_DIR) / "tests" / "fixtures" / "gguf" / "tiny-flux1-dev-gguf" / name).string();
}

// The byte position of tensor `name`'s info in a GGUF file: its dimension count follows the name.
size_t tensor_info(const std::string& bytes, const std::string& name) {
  std::string needle(8, '\0');
  const uint64_t n = name.size();
  std::memcpy(needle.data(), &n, 8);
  needle += name;
  const size_t at = bytes.find(needle);
  EXPECT_NE(at, std::string::npos) << name;
  return at + needle.size();
}

// Copies the fixture to {work}/flux1.gguf, changed by `edit` (its bytes); defines {file}; puts the
// GGUF model's transformer config into the workspace pipeline.
Setup gguf_file(std::function<void(std::string&)> edit) {
  return [=](Workspace& w) {
    std::string bytes = read_bytes(fixture("transformer.gguf"));
    edit(bytes);
    const std::string path = w.path("flux1.gguf");
    write_bytes(path, bytes);
    w.define("file", path);
    write_json(w.model_file("transformer/config.json"), read_json(fixture("transformer/config.json")));
  };
}

const std::string kQkv = "double_blocks.0.img_attn.qkv.weight";  // [3D, D], quantized

std::vector<BadInput> rows() {
  const std::vector<std::string> args = {"--model", "{model}", "--gguf", "{file}"};
  return {
      BadInput("gguf_truncated", kExitBadInput, "WeightError", {"'{file}': tensor '", "runs past the end of the file"})
          .setup(gguf_file([](std::string& b) { b.resize(b.size() - 100); }))
          .args(args),
      BadInput("gguf_bad_magic", kExitUsage, "UsageError", {"--gguf '{file}': not a GGUF file (no \"GGUF\" magic)"})
          .setup(gguf_file([](std::string& b) { b[0] = 'X'; }))
          .args(args),
      BadInput("gguf_bad_version", kExitBadInput, "WeightError",
               {"'{file}': GGUF version 7 is not supported (fluxmpi reads versions 2 and 3)"})
          .setup(gguf_file([](std::string& b) { b[4] = 7; }))
          .args(args),
      BadInput("gguf_offset_past_end", kExitBadInput, "WeightError",
               {"'{file}': tensor '" + kQkv + "' (", "runs past the end of the file"})
          .setup(gguf_file([](std::string& b) {
            const size_t at = tensor_info(b, kQkv) + 4 + 2 * 8 + 4;  // n_dims, ne[2], type: the offset
            const uint64_t far = uint64_t{1} << 40;
            std::memcpy(&b[at], &far, 8);
          }))
          .args(args),
      BadInput("gguf_unknown_type", kExitBadInput, "WeightError",
               {"'{file}': tensor '" + kQkv + "' has quantization type type 99, which fluxmpi does not read"})
          .setup(gguf_file([](std::string& b) {
            const size_t at = tensor_info(b, kQkv) + 4 + 2 * 8;
            const uint32_t type = 99;
            std::memcpy(&b[at], &type, 4);
          }))
          .args(args),
      BadInput("gguf_tensor_list_does_not_match_config", kExitBadInput, "WeightError",
               {"transformer file '{file}': holds 2 single_blocks (single_blocks.0-1) but model dir '{model}': "
                "transformer/config.json says 'num_single_layers' 3"})
          .setup([](Workspace& w) {
            gguf_file([](std::string&) {})(w);
            edit_json(w.model_file("transformer/config.json"), [](json& j) { j["num_single_layers"] = 3; });
          })
          .args(args),
      BadInput("gguf_tensor_of_another_shape", kExitBadInput, "WeightError",
               {"transformer file '{file}': tensor 'img_in.weight' has shape [128, 64], expected [256, 64]"})
          .setup(gguf_file([](std::string& b) {
            const size_t at = tensor_info(b, "img_in.weight") + 4 + 8;  // n_dims, ne[0]: ne[1], the rows
            const uint64_t rows = 128;
            std::memcpy(&b[at], &rows, 8);
          }))
          .args(args),
  };
}

class GgufFiles : public testing::TestWithParam<BadInput> {};

TEST_P(GgufFiles, FailsCleanly) {
  if (!fs::exists(fixture("transformer.gguf"))) FAIL() << "missing fixture " << fixture("transformer.gguf");
  GetParam().check();
}

INSTANTIATE_TEST_SUITE_P(BadInputs, GgufFiles, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
