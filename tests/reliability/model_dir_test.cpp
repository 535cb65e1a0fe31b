// Bad-input table, part 1: the model directory (missing files, configs that are not JSON, missing
// or ill-typed keys, configs that disagree with each other or with the weights) and the tokenizer
// files. Each row breaks one thing in a copy of a fixture pipeline and runs the real fluxmpi.

#include <filesystem>

#include "core/error.h"
#include "harness.h"
#include "safetensors_edit.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

void remove_path(const std::string& path) { fs::remove_all(path); }

auto set_key(const std::string& file, const std::string& key, json value) {
  return [=](Workspace& w) { edit_json(w.model_file(file), [&](json& j) { j[key] = value; }); };
}

std::vector<BadInput> rows() {
  return {
      // --- The folder and model_index.json ---------------------------------------------------
      BadInput("model_dir_missing", kExitUsage, "UsageError", {"--model '{work}/no-such-model': not found"})
          .args({"--model", "{work}/no-such-model"}),
      BadInput("model_index_missing", kExitBadInput, "ConfigError",
               {"model dir '{model}': model_index.json not found (not a diffusers pipeline folder)"})
          .setup([](Workspace& w) { remove_path(w.model_file("model_index.json")); }),
      BadInput("model_index_not_json", kExitBadInput, "ConfigError", {"model dir '{model}': model_index.json: not valid JSON"})
          .setup([](Workspace& w) { write_bytes(w.model_file("model_index.json"), "{\"_class_name\": \"FluxPipeline\",\n"); }),
      BadInput("model_index_wrong_pipeline", kExitBadInput, "ConfigError",
               {"model_index.json: '_class_name' must be one of FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, "
                "FluxFillPipeline, FluxControlPipeline, FluxKontextPipeline, Flux2Pipeline, Flux2KleinPipeline; got "
                "\"StableDiffusionPipeline\""})
          .setup(set_key("model_index.json", "_class_name", "StableDiffusionPipeline")),

      // --- One config file: missing, not JSON, missing or ill-typed keys ------------------------
      BadInput("vae_config_missing", kExitBadInput, "ConfigError", {"model dir '{model}': vae/config.json: file not found"})
          .setup([](Workspace& w) { remove_path(w.model_file("vae/config.json")); }),
      BadInput("transformer_config_not_json", kExitBadInput, "ConfigError",
               {"model dir '{model}': transformer/config.json: not valid JSON"})
          .setup([](Workspace& w) {
            const std::string f = w.model_file("transformer/config.json");
            truncate_file(f, read_bytes(f).size() / 2);
          }),
      BadInput("transformer_config_not_object", kExitBadInput, "ConfigError",
               {"transformer/config.json: not a JSON object"})
          .setup([](Workspace& w) { write_bytes(w.model_file("transformer/config.json"), "[19, 38]\n"); }),
      BadInput("transformer_config_ill_typed_key", kExitBadInput, "ConfigError",
               {"transformer/config.json: 'num_layers' must be a non-negative integer, got \"2\""})
          .setup([](Workspace& w) {
            edit_json(w.model_file("transformer/config.json"),
                      [](json& j) { j["num_layers"] = std::to_string(j["num_layers"].get<int64_t>()); });
          }),
      // The real FLUX.1-dev config has no axes_dims_rope: the default [16, 56, 56] fits only a head
      // dim of 128, which the tiny model does not have.
      BadInput("transformer_config_missing_key", kExitBadInput, "ConfigError",
               {"transformer/config.json: 'axes_dims_rope' must sum to attention_head_dim"})
          .setup([](Workspace& w) { edit_json(w.model_file("transformer/config.json"), [](json& j) { j.erase("axes_dims_rope"); }); }),
      BadInput("scheduler_config_ill_typed_key", kExitBadInput, "ConfigError",
               {"scheduler/scheduler_config.json: 'shift' must be a number, got \"3.0\""})
          .setup(set_key("scheduler/scheduler_config.json", "shift", "3.0")),
      BadInput("scheduler_config_unsupported_option", kExitBadInput, "ConfigError",
               {"scheduler/scheduler_config.json: 'use_karras_sigmas' = true is not supported"})
          .setup(set_key("scheduler/scheduler_config.json", "use_karras_sigmas", true)),
      BadInput("t5_config_out_of_range", kExitBadInput, "ConfigError",
               {"text_encoder_2/config.json: 'num_heads' must be a positive integer, got -4"})
          .setup(set_key("text_encoder_2/config.json", "num_heads", -4)),

      // --- Configs that disagree with each other ------------------------------------------------
      BadInput("configs_disagree_t5_width", kExitBadInput, "ConfigError",
               {"text_encoder_2/config.json: 'd_model' (48) must equal transformer/config.json 'joint_attention_dim' (32)"})
          .setup(set_key("text_encoder_2/config.json", "d_model", 48)),
      BadInput("configs_disagree_clip_width", kExitBadInput, "ConfigError",
               {"text_encoder/config.json: 'hidden_size' (48) must equal transformer/config.json 'pooled_projection_dim' (32)"})
          .setup(set_key("text_encoder/config.json", "hidden_size", 48)),
      BadInput("configs_disagree_vae_channels", kExitBadInput, "ConfigError",
               {"vae/config.json: 'latent_channels' (8) times 4 must equal transformer/config.json 'out_channels' (64)"})
          .setup(set_key("vae/config.json", "latent_channels", 8)),

      // --- Configs that disagree with the weights -----------------------------------------------
      BadInput("config_disagrees_with_weights_blocks", kExitBadInput, "ConfigError",
               {"transformer/config.json: 'num_layers' is 3 but the weights hold 2 transformer_blocks"})
          .setup(set_key("transformer/config.json", "num_layers", 3)),
      BadInput("config_disagrees_with_weights_guidance", kExitBadInput, "ConfigError",
               {"transformer/config.json: 'guidance_embeds' is false but the weights have time_text_embed.guidance_embedder"})
          .setup(set_key("transformer/config.json", "guidance_embeds", false)),
      BadInput("config_disagrees_with_weights_width", kExitBadInput, "ConfigError",
               {"transformer/config.json: 'num_attention_heads' x 'attention_head_dim'", "x_embedder.weight"})
          .setup([](Workspace& w) {
            edit_json(w.model_file("transformer/config.json"),
                      [](json& j) { j["num_attention_heads"] = 2 * j["num_attention_heads"].get<int64_t>(); });
          }),
      BadInput("clip_config_disagrees_with_weights", kExitBadInput, "WeightError",
               {"model dir '{model}': text_encoder: tensor 'text_model.encoder.layers.0.mlp.fc1.weight'", "expected [48, "})
          .setup(set_key("text_encoder/config.json", "intermediate_size", 48)),
      // The VAE runs last, after the denoising loop: its config is checked against its weights
      // at validation, like the transformer's, before any heavy work and any checkpoint.
      BadInput("vae_config_disagrees_with_weights", kExitBadInput, "WeightError",
               {"model dir '{model}': vae: tensor 'decoder.up_blocks.0.resnets.", "' not found (expected shape"})
          .setup([](Workspace& w) {
            edit_json(w.model_file("vae/config.json"),
                      [](json& j) { j["layers_per_block"] = j.value("layers_per_block", 1) + 1; });
          })
          .args({"--checkpoint", "{work}/out/run.h5"}),

      // --- Tokenizer files ----------------------------------------------------------------------
      BadInput("clip_vocab_truncated", kExitBadInput, "TokenizerError",
               {"model dir '{model}': tokenizer/vocab.json: not valid JSON"})
          .setup([](Workspace& w) { truncate_file(w.model_file("tokenizer/vocab.json"), 1000); }),
      BadInput("clip_vocab_missing_byte_symbol", kExitBadInput, "TokenizerError",
               {"tokenizer/vocab.json: the byte symbol \"a\" (byte 97) is missing"})
          .setup([](Workspace& w) { edit_json(w.model_file("tokenizer/vocab.json"), [](json& j) { j.erase("a"); }); }),
      BadInput("clip_merges_malformed", kExitBadInput, "TokenizerError",
               {"model dir '{model}': tokenizer/merges.txt: line 2:"})
          .setup([](Workspace& w) { write_bytes(w.model_file("tokenizer/merges.txt"), "#version: 0.2\nt h e\n"); }),
      BadInput("t5_spiece_garbage", kExitBadInput, "TokenizerError",
               {"model dir '{model}': tokenizer_2/spiece.model: not a sentencepiece model"})
          .setup([](Workspace& w) {
            std::string garbage(4096, '\0');
            for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 2654435761u) >> 13);
            write_bytes(w.model_file("tokenizer_2/spiece.model"), garbage);
          }),
      BadInput("t5_spiece_missing", kExitBadInput, "TokenizerError",
               {"model dir '{model}': tokenizer_2/spiece.model: file not found"})
          .setup([](Workspace& w) { remove_path(w.model_file("tokenizer_2/spiece.model")); }),
      BadInput("t5_special_tokens_disagree", kExitBadInput, "TokenizerError",
               {"tokenizer_2/special_tokens_map.json: 'eos_token' is \"<pad>\" but spiece.model has"})
          .setup(set_key("tokenizer_2/special_tokens_map.json", "eos_token", "<pad>")),
  };
}

class ModelDirectory : public testing::TestWithParam<BadInput> {};

TEST_P(ModelDirectory, FailsCleanly) { GetParam().check(); }

INSTANTIATE_TEST_SUITE_P(BadInputs, ModelDirectory, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
