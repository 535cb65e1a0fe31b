#pragma once
/// Pieces shared by the CLIP and T5 text encoders: the activation named by a transformers config
/// and the check of token ids against the embedding table.

#include <ATen/ATen.h>

#include <string>

namespace fluxmpi::text_models {

/// transformers ACT2FN names used by CLIP (hidden_act) and T5 (dense activation).
enum class Activation { QuickGelu, Gelu, GeluTanh, Relu, Silu };

/// "quick_gelu" | "gelu" (exact, erf) | "gelu_new" (tanh approximation) | "relu" | "silu".
/// Throws ConfigError naming `what` (e.g. "text_encoder/config.json 'hidden_act'") otherwise.
Activation parse_activation(const std::string& name, const std::string& what);
const char* activation_name(Activation act);
at::Tensor activate(Activation act, const at::Tensor& x);

/// Throws ConfigError unless every id of `ids` is in [0, vocab_size): the tokenizer and the
/// model's `vocab_size` (named by `what`) disagree otherwise.
void check_token_ids(const at::Tensor& ids, int64_t vocab_size, const std::string& what);

}  // namespace fluxmpi::text_models
