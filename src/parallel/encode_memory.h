#pragma once
/// Rank 0's VAE-encode stage of the image-conditioned modes (docs/images.md, "Memory"): the
/// encoder's parameters and its peak activations for one input image, from the VAE config alone,
/// for --dry-run. Rank 0 holds the encoder only in this stage (after the text encoders are freed,
/// before its transformer slice is loaded) and encodes one image at a time.

#include <cstdint>

#include "io/configs.h"
#include "io/redux_dir.h"

namespace fluxmpi::parallel {

/// The parts of AutoencoderKL that encoding runs: `encoder.*` and `quant_conv` (if used).
int64_t count_vae_encoder_params(const io::VaeConfig& config, bool use_quant_conv);

struct EncodeStage {
  uint64_t weight_bytes = 0;
  uint64_t activation_bytes = 0;  ///< the largest level's tensors alive at once, and the mid-block scores
  uint64_t total() const { return weight_bytes + activation_bytes; }
};

/// The stage for an input of height x width pixels (after the resize) in a dtype of `dtype_bytes`;
/// `attention_chunk_bytes` bounds the mid-block attention's score chunks (models/vae).
EncodeStage vae_encode_stage(const io::VaeConfig& config, bool use_quant_conv, int64_t height, int64_t width,
                             int64_t dtype_bytes, int64_t attention_chunk_bytes);

/// FLUX.1 Redux's stage on rank 0 (docs/redux.md), between the text encoders and the blocks: the
/// SigLIP encoder and the Redux embedder, run on one image at a time, and the embeddings of the
/// job's `images` reference images they leave.
EncodeStage redux_encode_stage(const io::SiglipVisionConfig& encoder, const io::ReduxEmbedderConfig& embedder,
                               int64_t images, int64_t dtype_bytes, int64_t attention_chunk_bytes);

}  // namespace fluxmpi::parallel
