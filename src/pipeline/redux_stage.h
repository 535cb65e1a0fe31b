#pragma once
/// Rank 0's FLUX.1 Redux stage (docs/redux.md): the image side of diffusers' FluxPriorReduxPipeline.
/// After the text encoders are freed and before the transformer slice loads, rank 0 loads the SigLIP
/// vision encoder and the Redux embedder, turns each reference image into its tokens, and frees
/// them; redux_text() then builds the text stream the step loop reads (S + L tokens).

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/image_file.h"
#include "io/redux_dir.h"
#include "models/siglip/redux_prior.h"

namespace fluxmpi::pipeline {

/// Everything about a Redux folder that is checked before heavy work: its embedder writes tokens
/// of the transformer's text width (ConfigError naming both configs otherwise), and both weight
/// files hold every parameter with its shape and no unclaimed key (WeightError), from the headers.
void check_redux(const io::ReduxDir& dir, const io::TransformerConfig& transformer, const std::string& transformer_label);

class ReduxEncoder {
 public:
  /// Loads image_encoder/ and image_embedder/ of `dir` in `dtype` on `device`.
  ReduxEncoder(const io::ReduxDir& dir, at::ScalarType dtype, at::Device device);
  ~ReduxEncoder();
  ReduxEncoder(ReduxEncoder&&) noexcept;

  /// image_embeds [N, L, txt_in_features] in the run dtype, one image at a time (each decoded RGB,
  /// as io::read_image returns it) through the processor, the encoder and the embedder.
  at::Tensor encode(const std::vector<io::Image8>& images) const;
  int64_t parameter_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The prior's text side for one prompt: `text` (the prompt's T5 embeddings [S, D] and CLIP pooled
/// [P]) or, when undefined, zeros of max_sequence_length x joint_attention_dim and
/// pooled_projection_dim (the prior without text encoders), with the images' tokens appended,
/// scaled and summed (models/siglip/redux_prior.h).
siglip::ReduxPrompt redux_text(const at::Tensor& prompt_embeds, const at::Tensor& pooled, int64_t max_sequence_length,
                               const io::TransformerConfig& transformer, const at::Tensor& image_embeds,
                               const std::vector<double>& prompt_scales, const std::vector<double>& pooled_scales);

}  // namespace fluxmpi::pipeline
