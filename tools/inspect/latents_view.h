#pragma once
// Pictures of stored latents for fluxmpi-inspect: which latents a --step/--latent choice means,
// the fast linear latent -> RGB preview, and the real VAE decode.

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/checkpoint_reader.h"
#include "io/model_dir.h"
#include "io/png.h"

namespace fluxmpi::inspect {

// What to show of a stored row (x_{k+1}, v_k): the predicted clean latent
// x0 = x_{k+1} - sigma_{k+1} * v_k, or the noisy latent x_{k+1} itself.
enum class LatentKind { X0, Noisy };
// "x0" | "noisy"; UsageError otherwise.
LatentKind parse_latent_kind(const std::string& text);

struct SelectedLatents {
  int64_t step = -1;  // the row's step; -1: the initial noise
  LatentKind kind = LatentKind::Noisy;
  at::Tensor packed;  // [L_img, token_dim] float32
  std::string description;  // "x0 predicted at step 3 (sigma 0.25)", for messages and PNG text
};

// The latents of `step` (default: the last committed row; -1: the initial noise, always noisy).
// UsageError when the step has no committed row.
SelectedLatents select_latents(const ckpt::CheckpointReader& reader, int64_t image, std::optional<int64_t> step,
                               LatentKind kind);

// One pixel per latent cell through the fixed FLUX.1 latent -> RGB map, upscaled (nearest) by
// `scale` so the preview has the size of the image. Needs 16 latent channels (UsageError otherwise).
io::RgbImage latent_preview(const at::Tensor& packed, const ckpt::ImageShape& shape, int64_t scale);

// The image the VAE of `model` decodes from the latents (fp32, CPU). ConfigError when the
// model's VAE does not fit the checkpoint's latent geometry.
io::RgbImage decode_latents(const at::Tensor& packed, const ckpt::ImageShape& shape, const io::ModelSources& model);

}  // namespace fluxmpi::inspect
