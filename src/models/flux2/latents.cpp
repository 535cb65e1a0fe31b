// Semantics of diffusers Flux2Pipeline.prepare_latents and its latent/id helpers (see latents.h).
#include "models/flux2/latents.h"

#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"

namespace fluxmpi::flux2 {

namespace {

std::vector<int64_t> patchified_shape(int64_t num_images, const LatentGeometry& g) {
  return {num_images, g.token_dim(), g.latent_height / 2, g.latent_width / 2};
}

at::Tensor draw(int64_t seed, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  // torch.Generator.manual_seed takes the seed as a uint64 bit pattern (as pipeline/noise.cpp).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  return at::randn(shape, gen, at::TensorOptions().dtype(dtype));
}

}  // namespace

at::Tensor initial_noise(int64_t seed, int64_t num_images, const LatentGeometry& g, at::ScalarType dtype) {
  FLUX_CHECK(num_images >= 1 && !is_empty(g), "initial_noise: ", num_images, " images of latent ", g.latent_height,
             "x", g.latent_width);
  // One draw for the whole batch: torch's normal sampler fills blocks of 16 values, so drawing the
  // images one after another from one generator would give other numbers.
  return draw(seed, patchified_shape(num_images, g), dtype);
}

at::Tensor initial_noise(const std::vector<int64_t>& seeds, const LatentGeometry& g, at::ScalarType dtype) {
  FLUX_CHECK(!seeds.empty() && !is_empty(g), "initial_noise: ", seeds.size(), " seeds, latent ", g.latent_height, "x",
             g.latent_width);
  std::vector<at::Tensor> images;
  images.reserve(seeds.size());
  for (int64_t seed : seeds) images.push_back(draw(seed, patchified_shape(1, g), dtype));
  return at::cat(images, 0);
}

at::Tensor pack_latents(const at::Tensor& x) {
  // x: [n, C4, h2, w2]
  FLUX_CHECK(x.dim() == 4, "pack_latents: expected [n, C, h, w], got ", x.sizes());
  return x.reshape({x.size(0), x.size(1), x.size(2) * x.size(3)}).permute({0, 2, 1}).contiguous();
}

at::Tensor unpack_latents_with_ids(const at::Tensor& packed, const at::Tensor& ids) {
  // packed: [n, L, C4]; ids: [L, 4] or [n, L, 4]
  FLUX_CHECK(packed.dim() == 3 && packed.size(1) >= 1, "unpack_latents_with_ids: expected packed [n, L, C], got ",
             packed.sizes());
  const int64_t n = packed.size(0), L = packed.size(1), C = packed.size(2);
  const at::Tensor batch_ids = ids.dim() == 2 ? ids.unsqueeze(0).expand({n, -1, -1}) : ids;
  FLUX_CHECK(batch_ids.dim() == 3 && batch_ids.size(0) == n && batch_ids.size(1) == L && batch_ids.size(2) == 4,
             "unpack_latents_with_ids: ids ", ids.sizes(), " do not fit packed latents ", packed.sizes());
  std::vector<at::Tensor> images;
  images.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor pos = batch_ids[i].to(packed.device(), at::kLong);
    const at::Tensor rows = pos.select(1, 1), cols = pos.select(1, 2);
    FLUX_CHECK(rows.min().item<int64_t>() >= 0 && cols.min().item<int64_t>() >= 0,
               "unpack_latents_with_ids: negative position ids");
    const int64_t H = rows.max().item<int64_t>() + 1, W = cols.max().item<int64_t>() + 1;
    at::Tensor out = at::zeros({H * W, C}, packed.options());
    out.index_copy_(0, rows * W + cols, packed[i]);
    images.push_back(out.view({H, W, C}).permute({2, 0, 1}));
  }
  return at::stack(images, 0);
}

at::Tensor unpatchify_latents(const at::Tensor& x) {
  // x: [n, 4c, h2, w2] -> [n, c, 2 h2, 2 w2]
  FLUX_CHECK(x.dim() == 4 && x.size(1) % 4 == 0, "unpatchify_latents: expected [n, 4c, h, w], got ", x.sizes());
  const int64_t n = x.size(0), c = x.size(1) / 4, h = x.size(2), w = x.size(3);
  return x.reshape({n, c, 2, 2, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({n, c, 2 * h, 2 * w});
}

at::Tensor patchify_latents(const at::Tensor& x) {
  // x: [n, c, h, w] -> [n, 4c, h/2, w/2]
  FLUX_CHECK(x.dim() == 4 && x.size(2) % 2 == 0 && x.size(3) % 2 == 0,
             "patchify_latents: expected [n, c, h, w] with even h and w, got ", x.sizes());
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2) / 2, w = x.size(3) / 2;
  return x.reshape({n, c, h, 2, w, 2}).permute({0, 1, 3, 5, 2, 4}).reshape({n, 4 * c, h, w}).contiguous();
}

namespace {

// (t, row, col, 0) over a rows x cols grid, row-major.
at::Tensor grid_ids(int64_t t, int64_t rows, int64_t cols) {
  at::Tensor ids = at::zeros({rows * cols, 4}, at::kLong);
  const at::Tensor token = at::arange(rows * cols, at::kLong);
  ids.select(1, 0).fill_(t);
  ids.select(1, 1).copy_(at::floor_divide(token, cols));
  ids.select(1, 2).copy_(at::remainder(token, cols));
  return ids;
}

}  // namespace

at::Tensor latent_ids(const LatentGeometry& g) { return grid_ids(0, g.latent_height / 2, g.latent_width / 2); }

at::Tensor reference_ids(int64_t index, int64_t rows, int64_t cols) {
  FLUX_CHECK(index >= 0 && rows >= 1 && cols >= 1, "reference_ids: reference ", index, " of ", rows, "x", cols, " tokens");
  constexpr int64_t kScale = 10;  // _prepare_image_ids(scale=10): t = scale + scale * index
  return grid_ids(kScale + kScale * index, rows, cols);
}

at::Tensor text_ids(int64_t sequence_length) {
  at::Tensor ids = at::zeros({sequence_length, 4}, at::kLong);
  ids.select(1, 3).copy_(at::arange(sequence_length, at::kLong));
  return ids;
}

}  // namespace fluxmpi::flux2
