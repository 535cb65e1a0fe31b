#pragma once
// Shared by the step-loop tests (pipeline_denoise_test, pipeline_patches_test): an observer that
// keeps every step's latents and noise prediction, and the tiny transformer they run.

#include <map>
#include <utility>

#include "io/configs.h"
#include "pipeline/denoise.h"

namespace fluxmpi::test {

/// Keeps (image, step) -> latents after the step and its noise prediction.
class StepRecorder : public pipeline::DenoiseObserver {
 public:
  void on_step(const pipeline::WorkGroup& g, int64_t step, const at::Tensor& latents, const at::Tensor& v) override {
    for (int64_t j = 0; j < g.count; ++j) {
      x[{g.first_image + j, step}] = latents[j].clone();
      vs[{g.first_image + j, step}] = v[j].clone();
    }
  }
  std::map<std::pair<int64_t, int64_t>, at::Tensor> x, vs;
};

/// 1 double + 2 single blocks, 2 heads of 16, guidance embedder: small enough for exact tests.
inline io::TransformerConfig tiny_loop_transformer() {
  io::TransformerConfig c;
  c.num_layers = 1;
  c.num_single_layers = 2;
  c.attention_head_dim = 16;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 24;
  c.pooled_projection_dim = 20;
  c.guidance_embeds = true;
  c.axes_dims_rope = {4, 6, 6};
  return c;
}

}  // namespace fluxmpi::test
