#pragma once
/// The one weight loader: every parameter of a module tree is taken from the store by its name
/// (the diffusers / transformers key), shape-checked and converted to the run dtype and device.
/// Missing keys, wrong shapes and keys in the owned range that no parameter claims are errors
/// naming the key, the file, the expected and the actual shape.

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/tensor_store.h"

namespace fluxmpi::nn {

/// Changes stored weights while they load (LoRA merges, models/common/lora.h): `applies(key)` says
/// which parameter keys; `apply(key, w)` gets the stored tensor as a fresh fp32 copy and changes it
/// in place; the loader then rounds it once to the run dtype.
struct WeightAdjust {
  std::function<bool(const std::string& key)> applies;
  std::function<void(const std::string& key, at::Tensor& weight)> apply;

  bool wants(const std::string& key) const { return applies && applies(key); }
};

struct LoadRules {
  /// Prepended to every parameter name to form its key (e.g. "text_model.").
  std::string prefix;
  /// Keys under these prefixes are never loaded and never reported (the VAE's "encoder.").
  std::vector<std::string> skip_prefixes;
  /// Other keys to try, in order, when a parameter's own key is absent (tied weights: T5's
  /// "encoder.embed_tokens.weight" is "shared.weight").
  std::map<std::string, std::vector<std::string>> aliases;
  /// Keys this module tree must account for: any such key that no parameter claims is an error.
  /// Default (empty function): every key of the store that is not skipped.
  std::function<bool(const std::string&)> owned;
  /// Optional: weights changed while they load (keyed by the parameter's key, prefix included).
  WeightAdjust adjust;
};

struct LoadStats {
  int64_t tensors = 0;
  int64_t bytes = 0;  ///< bytes of the loaded parameters in the run dtype
};

/// Checks, from the safetensors headers alone, what load_module checks: every parameter stored
/// with its shape, every owned key claimed. Reads no tensor data.
void check_module(const torch::nn::Module& module, const io::TensorStore& store, const LoadRules& rules);

/// Loads all parameters of `module` (after the checks of check_module). After loading, the shards' pages are released.
LoadStats load_module(torch::nn::Module& module, const io::TensorStore& store, const LoadRules& rules,
                      at::ScalarType dtype, at::Device device);

/// Bytes of all parameters of `module` (after loading: in the run dtype).
int64_t parameter_bytes(const torch::nn::Module& module);

}  // namespace fluxmpi::nn
