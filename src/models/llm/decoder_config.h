#pragma once
/// The text encoders of FLUX.2 are decoder-only language models: Qwen3 (FLUX.2 [klein],
/// transformers `Qwen3ForCausalLM`) and the text tower of Mistral Small 3.x (FLUX.2 [dev],
/// `Mistral3ForConditionalGeneration`, whose `text_config` is a `MistralConfig`). Both are the
/// same decoder up to Qwen3's per-head q/k RMSNorm; this is its config, parsed from the
/// text encoder's config.json. The architecture fields have no defaults: a missing or bad one is
/// a ConfigError naming the file and the field (a guessed head_dim would silently be wrong, since
/// both real models have head_dim != hidden_size / num_attention_heads).

#include <cstdint>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace fluxmpi::llm {

/// Which checkpoint class the config describes (decides the key layout and the q/k norm).
enum class Architecture { Qwen3, Mistral3 };
const char* architecture_name(Architecture a);

struct DecoderConfig {
  Architecture architecture = Architecture::Qwen3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 0;
  double rope_theta = 0;
  bool tie_word_embeddings = false;  ///< read for completeness: the lm_head is never built
  bool qk_norm = false;              ///< Qwen3: RMSNorm over head_dim on q and k before RoPE
  /// Mistral's sliding window (0 = none). Sequences longer than it are refused at run time,
  /// since this decoder attends to the whole causal prefix.
  int64_t sliding_window = 0;

  int64_t kv_groups() const { return num_attention_heads / num_key_value_heads; }
};

/// Parses a text encoder config.json: `architectures` (or `model_type`) picks the class; for
/// Mistral3 the decoder fields are read from `text_config`. Throws ConfigError "<file>: '<key>' ..."
/// (nested keys as 'text_config.hidden_size').
DecoderConfig parse_decoder_config(const io::ConfigReader& reader);
/// parse_decoder_config of `<dir>/config.json`.
DecoderConfig read_decoder_config(const std::string& dir);

/// The hidden states diffusers' FLUX.2 pipelines take when the call does not name them:
/// klein (Qwen3) 9, 18, 27; dev (Mistral3) 10, 20, 30.
std::vector<int64_t> default_out_layers(Architecture a);

}  // namespace fluxmpi::llm
