#include "models/flux/latents.h"

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::flux {

LatentGeometry latent_geometry(int64_t height, int64_t width, int64_t vae_scale_factor, int64_t latent_channels) {
  LatentGeometry g;
  const int64_t unit = 2 * vae_scale_factor;
  g.latent_height = 2 * (height / unit);
  g.latent_width = 2 * (width / unit);
  g.height = g.latent_height * vae_scale_factor;
  g.width = g.latent_width * vae_scale_factor;
  g.channels = latent_channels;
  return g;
}

at::Tensor pack_latents(const at::Tensor& x) {
  nn::check_shape(x, {-1, -1, -1, -1}, "pack_latents input [B, C, h, w]");
  const int64_t B = x.size(0), C = x.size(1), h = x.size(2), w = x.size(3);
  FLUX_CHECK(h % 2 == 0 && w % 2 == 0, "latent size must be even, got ", h, "x", w);
  return x.view({B, C, h / 2, 2, w / 2, 2}).permute({0, 2, 4, 1, 3, 5}).reshape({B, (h / 2) * (w / 2), C * 4});
}

at::Tensor unpack_latents(const at::Tensor& x, int64_t h, int64_t w) {
  nn::check_shape(x, {-1, (h / 2) * (w / 2), -1}, "unpack_latents input [B, L, 4C]");
  const int64_t B = x.size(0), C = x.size(2) / 4;
  return x.view({B, h / 2, w / 2, C, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({B, C, h, w});
}

at::Tensor image_position_ids(int64_t h, int64_t w) {
  const int64_t rows = h / 2, cols = w / 2;
  at::Tensor ids = at::zeros({rows, cols, 3}, at::kFloat);
  ids.select(2, 1).add_(at::arange(rows, at::kFloat).unsqueeze(1));
  ids.select(2, 2).add_(at::arange(cols, at::kFloat).unsqueeze(0));
  return ids.reshape({rows * cols, 3});
}

at::Tensor reference_position_ids(int64_t latent_height, int64_t latent_width) {
  at::Tensor ids = image_position_ids(latent_height, latent_width);
  ids.select(1, 0).fill_(1);
  return ids;
}

at::Tensor text_position_ids(int64_t sequence_length) { return at::zeros({sequence_length, 3}, at::kFloat); }

}  // namespace fluxmpi::flux
