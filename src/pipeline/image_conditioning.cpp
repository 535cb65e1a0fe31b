#include "pipeline/image_conditioning.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <cstring>

#include "core/error.h"
#include "io/image_resize.h"

namespace fluxmpi::pipeline {
namespace {

io::Image8 resized(const io::Image8& image, const flux::LatentGeometry& g) {
  if (image.width == g.width && image.height == g.height) return image;
  return io::resize_lanczos(image, static_cast<int>(g.width), static_cast<int>(g.height));
}

// Fill's mask at pixel resolution as 64 channels per latent cell: mask[:, 0].view(n, h, 8, w, 8)
// .permute(0, 2, 4, 1, 3) -> channel ky * 8 + kx of cell (i, j) = pixel (8i + ky, 8j + kx).
at::Tensor fill_mask_channels(const at::Tensor& mask, const flux::LatentGeometry& g, int64_t scale) {
  const int64_t n = mask.size(0), h = g.latent_height, w = g.latent_width;
  return mask.select(1, 0).view({n, h, scale, w, scale}).permute({0, 2, 4, 1, 3}).reshape({n, scale * scale, h, w});
}

}  // namespace

at::Tensor draw_noise(at::Generator& gen, const flux::LatentGeometry& g, at::ScalarType dtype) {
  return at::randn({1, g.channels, g.latent_height, g.latent_width}, gen, at::TensorOptions().dtype(dtype));
}

at::Tensor encode_sample(const vae::VaeEncoder& encoder, const at::Tensor& x, at::Generator& gen,
                         const vae::EncodeOptions& options) {
  vae::LatentDistribution dist = encoder->encode(x.to(encoder->dtype()), options);
  return encoder->normalize(dist.sample(gen)).to(at::kCPU);
}

at::Tensor image_pixels(const io::Image8& image) {
  at::Tensor t = at::empty({image.height, image.width, image.channels}, at::kByte);
  std::memcpy(t.data_ptr(), image.pixels.data(), image.pixels.size());
  return t;
}

at::Tensor preprocess_image(const io::Image8& rgb, const flux::LatentGeometry& g) {
  FLUX_CHECK(rgb.channels == 3, "preprocess_image of a ", rgb.channels, "-channel image");
  at::Tensor u8 = image_pixels(resized(rgb, g)).unsqueeze(0);
  return (u8.to(at::kFloat) / 255.0).permute({0, 3, 1, 2}).contiguous() * 2.0 - 1.0;
}

at::Tensor preprocess_mask(const io::Image8& mask, const flux::LatentGeometry& g) {
  io::Image8 binary = io::binarize_mask(io::to_grey(resized(mask, g)));
  return image_pixels(binary).unsqueeze(0).to(at::kFloat).permute({0, 3, 1, 2}).contiguous();
}

at::Tensor scale_noise(const at::Tensor& x0, const at::Tensor& noise, float sigma) {
  const at::Tensor s = at::full({1}, sigma, at::TensorOptions().dtype(at::kFloat).device(x0.device()));
  return s * noise + (1.0 - s) * x0;
}

at::Tensor inpaint_blend(const at::Tensor& stepped, const at::Tensor& image_latents, const at::Tensor& noise,
                         const at::Tensor& mask, const sched::Schedule& cut, int64_t step) {
  at::Tensor proper = step + 1 < cut.num_steps()
                          ? scale_noise(image_latents, noise, cut.sigmas[static_cast<size_t>(step) + 1])
                          : image_latents;
  return ((1 - mask) * proper + mask * stepped).to(stepped.scalar_type());
}

Conditioning condition_image(const ConditionInputs& in, const vae::VaeEncoder& encoder, const flux::LatentGeometry& g,
                             const sched::Schedule& full, at::ScalarType dtype, const vae::EncodeOptions& options) {
  c10::InferenceMode guard;
  // torch.Generator.manual_seed takes the seed as a uint64 bit pattern.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(in.seed));
  Conditioning out;
  switch (in.mode) {
    case PipelineMode::Img2Img:
    case PipelineMode::Inpaint:
    case PipelineMode::Fill: {
      const at::Tensor image = preprocess_image(in.image, g);
      const at::Tensor image_latents = encode_sample(encoder, image, gen, options).to(dtype);
      const at::Tensor noise = draw_noise(gen, g, dtype);
      const float sigma = full.sigmas[static_cast<size_t>(in.t_start)];
      out.initial = flux::pack_latents(scale_noise(image_latents, noise, sigma)).to(dtype);
      if (in.mode == PipelineMode::Img2Img) {
        out.stored = flux::pack_latents(image_latents).to(at::kFloat);
        break;
      }
      const at::Tensor mask = preprocess_mask(in.mask, g);
      if (in.mode == PipelineMode::Inpaint) {
        // F.interpolate(mask, (h, w)), mode nearest: the top-left pixel of each cell, for every channel.
        const int64_t f = g.height / g.latent_height;
        at::Tensor cells = mask.slice(2, 0, g.height, f).slice(3, 0, g.width, f).repeat({1, g.channels, 1, 1});
        out.image_latents = flux::pack_latents(image_latents);
        out.noise = flux::pack_latents(noise);
        out.mask = flux::pack_latents(cells.to(dtype));
        out.stored = out.image_latents.to(at::kFloat);
        // diffusers also encodes image * (mask < 0.5) here, a third draw the 64-channel transformer
        // never reads; nothing is drawn after it, so leaving it out changes no number.
        break;
      }
      // Fill: the masked image (image * (1 - mask)) encoded with the third draw, and the mask itself.
      const at::Tensor masked = encode_sample(encoder, image * (1 - mask), gen, options).to(dtype);
      const int64_t f = g.height / g.latent_height;
      out.features = at::cat({flux::pack_latents(masked), flux::pack_latents(fill_mask_channels(mask.to(dtype), g, f))}, 2);
      out.stored = out.features.to(at::kFloat);
      break;
    }
    case PipelineMode::Control: {
      const at::Tensor control = encode_sample(encoder, preprocess_image(in.control, g), gen, options).to(dtype);
      out.features = flux::pack_latents(control);
      out.stored = out.features.to(at::kFloat);
      out.initial = flux::pack_latents(draw_noise(gen, g, dtype));
      break;
    }
    default:
      throw InternalError(str_cat("condition_image: mode ", mode_name(in.mode), " has no image conditioning here"));
  }
  return out;
}

}  // namespace fluxmpi::pipeline
