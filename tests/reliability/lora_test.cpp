// Bad-input table, part 6: LoRA files (--lora FILE[:SCALE]). A missing file or a scale that is not
// a number is a usage error; a key of neither layout, a key naming no module, a pair without its
// up tensor and an update that does not fit its module are WeightErrors naming the file and the
// key, found by rank 0 at validation (before any weight is read), on one rank and on two.

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "harness.h"
#include "safetensors_edit.h"
#include "support/fixtures.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;
using Setup = std::function<void(Workspace&)>;

const std::string kDiffusers = "tiny-flux-dev-diffusers.safetensors";
const std::string kKohya = "tiny-flux-dev-kohya.safetensors";
const std::string kQ = "transformer.transformer_blocks.0.attn.to_q";

// Copies a fixture LoRA to {work}/lora.safetensors, changed by `edit`.
Setup broken_lora(const std::string& fixture, std::function<void(SafetensorsBytes&)> edit) {
  return [=](Workspace& w) {
    SafetensorsBytes st = SafetensorsBytes::read(test::fixture_root() + "/lora/" + fixture);
    edit(st);
    st.write(w.path("lora.safetensors"));
  };
}

// Renames a tensor, keeping its dtype, shape and bytes.
void rename(SafetensorsBytes& st, const std::string& from, const std::string& to) {
  const std::string bytes = st.bytes(from);
  const std::string dtype = st.header[from]["dtype"].get<std::string>();
  const auto shape = st.header[from]["shape"].get<std::vector<int64_t>>();
  st.remove(from);
  st.append(to, dtype, shape, bytes);
}

const std::vector<std::string> kLoraArgs = {"--lora", "{work}/lora.safetensors:0.5"};

std::vector<BadInput> rows() {
  return {
      BadInput("lora_file_missing", kExitUsage, "UsageError", {"--lora '{work}/absent.safetensors': not found"})
          .args({"--lora", "{work}/absent.safetensors"}),
      BadInput("lora_scale_not_finite", kExitUsage, "UsageError",
               {"--lora '{work}/lora.safetensors:nan': the scale must be a finite number"})
          .setup(broken_lora(kDiffusers, [](SafetensorsBytes&) {}))
          .args({"--lora", "{work}/lora.safetensors:nan"}),
      BadInput("lora_key_of_neither_layout", kExitBadInput, "WeightError",
               {"LoRA '{work}/lora.safetensors': '" + kQ + ".weight' is not a LoRA key of either layout"})
          .setup(broken_lora(kDiffusers, [](SafetensorsBytes& st) { rename(st, kQ + ".lora_A.weight", kQ + ".weight"); }))
          .args(kLoraArgs),
      BadInput("lora_key_names_no_module", kExitBadInput, "WeightError",
               {"LoRA '{work}/lora.safetensors': 'transformer.transformer_blocks.0.attn.to_z.lora_A.weight' names no module of the transformer"})
          .setup(broken_lora(kDiffusers, [](SafetensorsBytes& st) {
            rename(st, kQ + ".lora_A.weight", "transformer.transformer_blocks.0.attn.to_z.lora_A.weight");
            rename(st, kQ + ".lora_B.weight", "transformer.transformer_blocks.0.attn.to_z.lora_B.weight");
          }))
          .args(kLoraArgs),
      BadInput("lora_block_beyond_the_model", kExitBadInput, "WeightError",
               {"LoRA '{work}/lora.safetensors': 'lora_unet_double_blocks_7_img_attn_qkv.lora_down.weight' names no module of the transformer"})
          .setup(broken_lora(kKohya, [](SafetensorsBytes& st) {
            for (const char* part : {".lora_down.weight", ".lora_up.weight", ".alpha"})
              rename(st, std::string("lora_unet_double_blocks_0_img_attn_qkv") + part,
                     std::string("lora_unet_double_blocks_7_img_attn_qkv") + part);
          }))
          .args(kLoraArgs)
          .ranks(2),
      BadInput("lora_up_missing", kExitBadInput, "WeightError",
               {"LoRA '{work}/lora.safetensors': '" + kQ + ".lora_A.weight' has no '" + kQ + ".lora_B.weight'"})
          .setup(broken_lora(kDiffusers, [](SafetensorsBytes& st) { st.remove(kQ + ".lora_B.weight"); }))
          .args(kLoraArgs),
      BadInput("lora_shape_does_not_fit", kExitBadInput, "WeightError",
               {"LoRA '{work}/lora.safetensors': '" + kQ + ".lora_B.weight' has shape [64, 4], but the module it changes has 32 rows"})
          .setup(broken_lora(kDiffusers, [](SafetensorsBytes& st) {
            const std::string bytes = st.bytes(kQ + ".lora_B.weight");
            st.remove(kQ + ".lora_B.weight");
            st.append(kQ + ".lora_B.weight", "F32", {64, 4}, bytes + bytes);  // [32, 4] -> [64, 4]
          }))
          .args(kLoraArgs),
      BadInput("lora_fused_rows_do_not_fit", kExitBadInput, "WeightError",
               {"LoRA '{work}/lora.safetensors': 'lora_unet_single_blocks_0_linear1.lora_up.weight' has shape [96, 4], but the modules it changes have 224 rows"})
          .setup(broken_lora(kKohya, [](SafetensorsBytes& st) {
            const std::string key = "lora_unet_single_blocks_0_linear1.lora_up.weight";
            const std::string bytes = st.bytes(key).substr(0, 96 * 4 * 2);  // bf16 [224, 4] -> [96, 4]
            st.remove(key);
            st.append(key, "BF16", {96, 4}, bytes);
          }))
          .args(kLoraArgs)
          .ranks(2),
  };
}

class LoraFiles : public testing::TestWithParam<BadInput> {};

TEST_P(LoraFiles, FailsCleanly) {
  if (!fs::is_regular_file(test::fixture_root() + "/lora/" + kDiffusers)) {
    const std::string why = "LoRA fixtures not found in '" + test::fixture_root() + "/lora'";
    if (test::running_in_ci()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  GetParam().check();
}

INSTANTIATE_TEST_SUITE_P(BadInputs, LoraFiles, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
