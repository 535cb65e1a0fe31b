// Semantics of diffusers ReduxImageEncoder (pipelines/flux/modeling_flux.py).

#include "models/siglip/redux_embedder.h"

#include <c10/core/InferenceMode.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/error.h"
#include "models/common/cpu_linear.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::siglip {

ReduxImageEncoderImpl::ReduxImageEncoderImpl(const io::ReduxEmbedderConfig& c) {
  redux_up = register_module("redux_up", nn::Linear(c.redux_dim, 3 * c.txt_in_features));
  redux_down = register_module("redux_down", nn::Linear(3 * c.txt_in_features, c.txt_in_features));
}

at::Tensor ReduxImageEncoderImpl::forward(const at::Tensor& x) const {
  // x: [B, L, redux_dim] -> [B, L, txt_in_features]
  c10::InferenceMode inference;
  nn::check_shape(x, {-1, -1, redux_up->in_features}, "Redux embedder input [B, L, redux_dim]");
  const at::Tensor& w = redux_up->weight;
  return redux_down->forward(at::silu(redux_up->forward(x.to(w.device(), w.scalar_type()))));
}

void check_redux_embedder_weights(const io::ReduxEmbedderConfig& config, const io::TensorStore& store) {
  ReduxImageEncoder model(config);
  nn::check_module(*model, store, {});
}

ReduxImageEncoder load_redux_embedder(const io::ReduxEmbedderConfig& config, const io::TensorStore& store,
                                      at::ScalarType dtype, at::Device device) {
  ReduxImageEncoder model(config);
  nn::load_module(*model, store, {}, dtype, device);
  nn::use_gemm_layout(*model);  // as the encoder's (siglip_vision.cpp)
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  return model;
}

}  // namespace fluxmpi::siglip
