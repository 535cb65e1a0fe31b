#pragma once
/// The FLUX.2 folder's configs read together and checked against each other and against the
/// weight headers (no weight is read): what prepare_flux2_run needs before it plans.

#include <vector>

#include "io/configs.h"
#include "io/flux2_configs.h"
#include "io/model_dir.h"

namespace fluxmpi::pipeline {

struct Flux2Shapes {
  io::Flux2TransformerConfig transformer;
  io::VaeConfig vae;            ///< AutoencoderKLFlux2's decoder side (latent_channels, levels, tiles)
  bool vae_quant_conv = true;   ///< its encoder's use_quant_conv (multi-reference editing encodes)
  io::LlmShape text_encoder;
};

/// Reads transformer/, vae/ and text_encoder/ configs; ConfigError naming the file and key when
/// they do not make one FLUX.2 pipeline (a FLUX.1 VAE, a text encoder of the other kind, widths
/// that disagree).
Flux2Shapes read_flux2_shapes(const io::ModelDir& dir);

/// --text-encoder-layers against the encoder: every layer within its depth, and as many layers as
/// the transformer's joint_attention_dim takes (joint_attention_dim = layers x hidden_size).
void check_text_encoder_layers(const std::vector<int64_t>& layers, const io::ModelDir& dir, const Flux2Shapes& shapes);

/// The weight headers: the transformer's and the VAE's always, the text encoder's when it will
/// run (`encodes`). WeightError naming the file and the key.
void check_flux2_weights(const io::ModelDir& dir, const Flux2Shapes& shapes, const std::vector<int64_t>& layers, bool encodes,
                         bool dry_run);

}  // namespace fluxmpi::pipeline
