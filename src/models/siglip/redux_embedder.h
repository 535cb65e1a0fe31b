#pragma once
/// The FLUX.1 Redux image embedder (`image_embedder/`), diffusers ReduxImageEncoder: SigLIP's
/// last_hidden_state [B, L, redux_dim] -> redux_down(silu(redux_up(x))) [B, L, txt_in_features],
/// tokens of the T5 embedding width that FluxPriorReduxPipeline appends to the text.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "io/redux_dir.h"
#include "io/tensor_store.h"
#include "models/common/layers.h"

namespace fluxmpi::siglip {

class ReduxImageEncoderImpl : public torch::nn::Module {
 public:
  explicit ReduxImageEncoderImpl(const io::ReduxEmbedderConfig& config);
  /// x: [B, L, redux_dim] (any float dtype, converted to the weights') -> image_embeds [B, L, txt_in_features].
  /// Runs under c10::InferenceMode.
  at::Tensor forward(const at::Tensor& x) const;

  nn::Linear redux_up{nullptr}, redux_down{nullptr};
};
TORCH_MODULE(ReduxImageEncoder);

/// Builds and loads the embedder from `store` (keys redux_up.*, redux_down.*; any other key is a
/// WeightError, as is a shape that disagrees with image_embedder/config.json).
ReduxImageEncoder load_redux_embedder(const io::ReduxEmbedderConfig& config, const io::TensorStore& store,
                                      at::ScalarType dtype, at::Device device);
/// What load_redux_embedder checks, from the safetensors headers alone.
void check_redux_embedder_weights(const io::ReduxEmbedderConfig& config, const io::TensorStore& store);

}  // namespace fluxmpi::siglip
