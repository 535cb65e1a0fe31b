#include "models/text_encoder_common.h"

#include "core/error.h"
#include "models/common/layers.h"

namespace fluxmpi::text_models {

Activation parse_activation(const std::string& name, const std::string& what) {
  if (name == "quick_gelu") return Activation::QuickGelu;
  if (name == "gelu") return Activation::Gelu;
  if (name == "gelu_new") return Activation::GeluTanh;
  if (name == "relu") return Activation::Relu;
  if (name == "silu") return Activation::Silu;
  throw ConfigError(str_cat(what, ": unsupported activation \"", name,
                            "\" (supported: quick_gelu, gelu, gelu_new, relu, silu)"));
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::QuickGelu: return "quick_gelu";
    case Activation::Gelu: return "gelu";
    case Activation::GeluTanh: return "gelu_new";
    case Activation::Relu: return "relu";
    case Activation::Silu: return "silu";
  }
  return "?";
}

at::Tensor activate(Activation act, const at::Tensor& x) {
  switch (act) {
    case Activation::QuickGelu: return nn::quick_gelu(x);
    case Activation::Gelu: return at::gelu(x);
    case Activation::GeluTanh: return nn::gelu_tanh(x);
    case Activation::Relu: return at::relu(x);
    case Activation::Silu: return at::silu(x);
  }
  throw InternalError("unknown activation");
}

void check_token_ids(const at::Tensor& ids, int64_t vocab_size, const std::string& what) {
  if (ids.numel() == 0) return;
  const int64_t lo = ids.min().item<int64_t>();
  const int64_t hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size)
    throw ConfigError(str_cat(what, ": token id ", lo < 0 ? lo : hi, " is outside the embedding table of ",
                              vocab_size, " rows (config 'vocab_size'); the tokenizer does not match the model"));
}

}  // namespace fluxmpi::text_models
