// Semantics of diffusers FluxPipeline (latent unpacking and de-scaling before vae.decode) and
// VaeImageProcessor.postprocess -> denormalize, pt_to_numpy, numpy_to_pil.
#include "models/vae/image_processor.h"

#include <c10/core/InferenceMode.h>

#include <cstring>

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::vae {

at::Tensor vae_input_from_packed(const at::Tensor& packed, const flux::LatentGeometry& geometry,
                                 const io::VaeConfig& config) {
  // packed: [B, L, 4C]
  FLUX_CHECK(geometry.channels == config.latent_channels, "latent geometry has ", geometry.channels,
             " channels but the VAE config has latent_channels ", config.latent_channels);
  nn::check_shape(packed, {-1, geometry.tokens(), geometry.token_dim()}, "packed latents [B, L, 4C]");
  at::Tensor latents = flux::unpack_latents(packed, geometry.latent_height, geometry.latent_width);
  // Scalar operands as in Python (tensor / float, then + float): the same kernels and roundings.
  return latents / config.scaling_factor + config.shift_factor;
}

std::vector<io::RgbImage> to_rgb_images(const at::Tensor& decoded) {
  // decoded: [B, 3, H, W]
  nn::check_shape(decoded, {-1, 3, -1, -1}, "decoded images [B, 3, H, W]");
  c10::InferenceMode guard;
  // denormalize runs in the decoder's dtype; pt_to_numpy converts to float32 afterwards.
  at::Tensor unit = (decoded * 0.5 + 0.5).clamp(0, 1);
  at::Tensor scaled = unit.to(at::kCPU).to(at::kFloat) * 255;
  // at::round rounds halfway cases to even, as numpy's round does.
  at::Tensor bytes = at::round(scaled).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
  const int64_t B = bytes.size(0), H = bytes.size(1), W = bytes.size(2);
  std::vector<io::RgbImage> images(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    io::RgbImage& image = images[static_cast<size_t>(b)];
    image.height = H;
    image.width = W;
    image.pixels.resize(static_cast<size_t>(H * W * 3));
    std::memcpy(image.pixels.data(), bytes[b].data_ptr<uint8_t>(), image.pixels.size());
  }
  return images;
}

io::RgbImage decode_image(const VaeDecoder& vae, const at::Tensor& packed, const flux::LatentGeometry& geometry,
                          const io::VaeConfig& config, const DecodeOptions& options) {
  // packed: [1, L, 4C] or [L, 4C]
  FLUX_CHECK(packed.dim() == 2 || (packed.dim() == 3 && packed.size(0) == 1),
             "decode_image expects the packed latents of one image, got shape ", nn::shape_string(packed.sizes()));
  at::Tensor batch = packed.dim() == 2 ? packed.unsqueeze(0) : packed;
  return decode_images(vae, batch, geometry, config, options).front();
}

std::vector<io::RgbImage> decode_images(const VaeDecoder& vae, const at::Tensor& packed,
                                        const flux::LatentGeometry& geometry, const io::VaeConfig& config,
                                        const DecodeOptions& options) {
  // packed: [B, L, 4C]
  return to_rgb_images(vae->decode(vae_input_from_packed(packed, geometry, config), options));
}

}  // namespace fluxmpi::vae
