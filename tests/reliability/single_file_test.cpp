// Bad-input table, part 6: single-file checkpoints (--model FILE, --vae FILE, ...). Each row
// copies a community file of the single-file fixtures into the workspace, breaks one thing in it
// and runs fluxmpi with the flags a user types (--model-config names the workspace's copy of the
// tiny pipeline): a file that is neither layout, blocks that skip a number, a config that does not
// fit the tensors, a tensor of another shape, an unknown dtype, a truncated file, a file that
// lacks the component it is given for.

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "harness.h"
#include "safetensors_edit.h"
#include "support/fixtures.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Setup = std::function<void(Workspace&)>;

std::string fixture_file(const std::string& name) { return test::fixture_root() + "/single-file/tiny-flux-dev/" + name; }

// The separate files, with the transformer at {work}/flux1.safetensors (the one the rows break).
std::vector<std::string> files_args() {
  return {"--model", "{work}/flux1.safetensors", "--vae", fixture_file("ae.safetensors"), "--text-encoder",
          fixture_file("clip_l.safetensors"), "--text-encoder-2", fixture_file("t5xxl.safetensors"), "--model-config",
          "{model}"};
}

// Copies the original-layout transformer to {work}/flux1.safetensors, changed by `edit`; defines {file}.
Setup edit_transformer(std::function<void(SafetensorsBytes&)> edit) {
  return [=](Workspace& w) {
    const std::string path = w.path("flux1.safetensors");
    SafetensorsBytes st = SafetensorsBytes::read(fixture_file("flux1-tiny-dev.safetensors"));
    edit(st);
    st.write(path);
    w.define("file", path);
  };
}

// Renames every tensor under `from` to `to` (the data stays where it is).
void rename_prefix(SafetensorsBytes& st, const std::string& from, const std::string& to) {
  for (const auto& name : st.names()) {
    if (name.rfind(from, 0) != 0) continue;
    json entry = st.header[name];
    st.header.erase(name);
    st.header[to + name.substr(from.size())] = entry;
  }
}

std::vector<BadInput> rows() {
  return {
      BadInput("single_file_neither_layout", kExitBadInput, "WeightError",
               {"--model '{file}': no FLUX component found: its keys (e.g. 'model.foo.weight') are neither"})
          .setup([](Workspace& w) {
            SafetensorsBytes st;
            st.header = json::object();
            st.append("model.foo.weight", "F32", {2, 2}, std::string(16, '\0'));
            const std::string path = w.path("flux1.safetensors");
            st.write(path);
            w.define("file", path);
          })
          .args(files_args()),
      BadInput("single_file_blocks_skip_a_number", kExitBadInput, "WeightError",
               {"transformer file '{file}': the blocks skip a number: no tensor 'single_blocks.1.*' between single_blocks.0 and "
                "single_blocks.3"})
          .setup(edit_transformer([](SafetensorsBytes& st) { rename_prefix(st, "single_blocks.1.", "single_blocks.3."); }))
          .args(files_args()),
      BadInput("single_file_config_disagrees_with_tensors", kExitBadInput, "WeightError",
               {"transformer file '{file}': tensor 'double_blocks.0.img_attn.proj.bias' has shape [32], expected [16] (the widths of "
                "model dir '{model}': transformer/config.json)"})
          .setup([](Workspace& w) {
            edit_transformer([](SafetensorsBytes&) {})(w);
            // Half the heads: the config's width is 16, the file's 32.
            edit_json(w.model_file("transformer/config.json"), [](json& j) { j["num_attention_heads"] = 1; });
          })
          .args(files_args()),
      BadInput("single_file_tensor_wrong_shape", kExitBadInput, "WeightError",
               {"transformer file '{file}': tensor 'txt_in.weight' has shape [16, 64], expected [32, 32]"})
          .setup(edit_transformer([](SafetensorsBytes& st) { st.header["txt_in.weight"]["shape"] = {16, 64}; }))
          .args(files_args()),
      BadInput("single_file_unknown_dtype", kExitBadInput, "WeightError",
               {"'{file}': tensor 'img_in.weight': unknown dtype 'F8_E3M4'"})
          .setup(edit_transformer([](SafetensorsBytes& st) { st.header["img_in.weight"]["dtype"] = "F8_E3M4"; }))
          .args(files_args()),
      BadInput("single_file_truncated", kExitBadInput, "WeightError", {"'{file}': tensor '", "run beyond the data section"})
          .setup([](Workspace& w) {
            edit_transformer([](SafetensorsBytes&) {})(w);
            const std::string path = w.path("flux1.safetensors");
            truncate_file(path, read_bytes(path).size() - 100);
          })
          .args(files_args()),
      BadInput("single_file_lacks_the_component", kExitBadInput, "WeightError",
               {"--vae '", "clip_l.safetensors': holds no vae (it holds text_encoder (transformers keys))"})
          .setup(edit_transformer([](SafetensorsBytes&) {}))
          .args({"--model", "{work}/flux1.safetensors", "--vae", fixture_file("clip_l.safetensors"), "--text-encoder",
                 fixture_file("clip_l.safetensors"), "--text-encoder-2", fixture_file("t5xxl.safetensors"), "--model-config",
                 "{model}"}),
      BadInput("single_file_component_missing", kExitUsage, "UsageError",
               {"--model '{file}' holds no vae (it holds transformer (original FLUX keys)): give --vae FILE|DIR"})
          .setup(edit_transformer([](SafetensorsBytes&) {}))
          .args({"--model", "{work}/flux1.safetensors", "--model-config", "{model}"}),
  };
}

class SingleFiles : public testing::TestWithParam<BadInput> {};

TEST_P(SingleFiles, FailsCleanly) {
  if (!test::single_file_fixtures_present()) {
    const std::string why = "single-file fixtures not found under '" + test::fixture_root() + "'";
    if (test::running_in_ci()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  GetParam().check();
}

INSTANTIATE_TEST_SUITE_P(BadInputs, SingleFiles, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
