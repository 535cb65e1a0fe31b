#include "latents_view.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "core/error.h"
#include "io/model_dir.h"
#include "models/flux/latents.h"
#include "models/flux2/latents.h"
#include "models/flux2/vae.h"
#include "models/vae/image_processor.h"
#include "models/vae/vae_decoder.h"

namespace fluxmpi::inspect {
namespace {

// Linear map from the 16 FLUX.1 latent channels (in the space the transformer denoises, i.e. the
// VAE latent after (z - shift) * scale) to RGB in [-1, 1]: the factors and bias of ComfyUI's latent
// previewer, class Flux in comfy/latent_formats.py (github.com/comfyanonymous/ComfyUI), fitted by
// its authors on FLUX.1 VAE latents. Rows: channels 0..15; columns: R, G, B.
constexpr float kFluxLatentRgb[16][3] = {
    {-0.0346f, 0.0244f, 0.0681f},  {0.0034f, 0.0210f, 0.0687f},   {0.0275f, -0.0668f, -0.0433f},
    {-0.0174f, 0.0160f, 0.0617f},  {0.0859f, 0.0721f, 0.0329f},   {0.0004f, 0.0383f, 0.0115f},
    {0.0405f, 0.0861f, 0.0915f},   {-0.0236f, -0.0185f, -0.0259f}, {-0.0245f, 0.0250f, 0.1180f},
    {0.1008f, 0.0755f, -0.0421f},  {-0.0515f, 0.0201f, 0.0011f},  {0.0428f, -0.0012f, -0.0036f},
    {0.0817f, 0.0765f, 0.0749f},   {-0.1264f, -0.0522f, -0.1103f}, {-0.0280f, -0.0881f, -0.0499f},
    {-0.1262f, -0.0982f, -0.0778f},
};
constexpr float kFluxLatentRgbBias[3] = {-0.0329f, -0.0718f, -0.0851f};

std::string list_text(const std::vector<int64_t>& v) {
  if (v.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += str_cat(i ? ", " : "", v[i]);
  return s;
}

}  // namespace

LatentKind parse_latent_kind(const std::string& text) {
  if (text == "x0") return LatentKind::X0;
  if (text == "noisy") return LatentKind::Noisy;
  throw UsageError(str_cat("--latent must be x0 or noisy, got '", text, "'"));
}

SelectedLatents select_latents(const ckpt::CheckpointReader& reader, int64_t image, std::optional<int64_t> step,
                               LatentKind kind) {
  std::vector<int64_t> stored = reader.step_indices(image);
  SelectedLatents out;
  if ((step && *step == -1) || (!step && stored.empty())) {
    out.packed = reader.initial_latents(image);
    out.description = "initial noise (before step 0)";
    return out;
  }
  const int64_t k = step ? *step : stored.back();
  if (std::find(stored.begin(), stored.end(), k) == stored.end())
    throw UsageError(str_cat("--step ", k, ": ", ckpt::image_group(image), " has no stored row for step ", k,
                             " (stored steps: ", list_text(stored), "; -1 = the initial noise)"));
  ckpt::StepRow row = reader.step(image, k);
  const float sigma = reader.sigmas(image)[k + 1].item<float>();
  out.step = k;
  out.kind = kind;
  if (kind == LatentKind::X0) {
    // The row holds x_{k+1} = x_k + (sigma_{k+1} - sigma_k) v_k; the flow's clean end point is
    // x_{k+1} - sigma_{k+1} v_k (equal to x_k - sigma_k v_k).
    out.packed = row.latents - sigma * row.noise_pred;
    out.description = str_cat("x0 predicted at step ", k, " (sigma ", sigma, ")");
  } else {
    out.packed = row.latents;
    out.description = str_cat("latents after step ", k, " (sigma ", sigma, ")");
  }
  return out;
}

io::RgbImage latent_preview(const at::Tensor& packed, const ckpt::ImageShape& shape, int64_t scale) {
  if (shape.latent_channels != 16)
    throw UsageError(str_cat("--preview: the FLUX.1 latent-to-RGB factors need 16 latent channels, this checkpoint has ",
                             shape.latent_channels, "; use --decode with the model"));
  const int64_t h = shape.latent_height, w = shape.latent_width;
  // packed: [L, 64] -> z: [16, h, w]
  at::Tensor z = flux::unpack_latents(packed.to(at::kFloat).unsqueeze(0), h, w)[0];
  at::Tensor factors = at::from_blob(const_cast<float*>(&kFluxLatentRgb[0][0]), {16, 3}, at::kFloat);
  at::Tensor bias = at::from_blob(const_cast<float*>(kFluxLatentRgbBias), {3}, at::kFloat);
  at::Tensor rgb = z.permute({1, 2, 0}).reshape({h * w, 16}).matmul(factors) + bias;  // [h*w, 3] in [-1, 1]
  at::Tensor u8 = at::round(((rgb + 1) / 2).clamp(0, 1) * 255).to(at::kByte).reshape({h, w, 3});
  u8 = u8.repeat_interleave(scale, 0).repeat_interleave(scale, 1).contiguous();
  io::RgbImage img;
  img.height = u8.size(0);
  img.width = u8.size(1);
  img.pixels.assign(u8.data_ptr<uint8_t>(), u8.data_ptr<uint8_t>() + u8.numel());
  return img;
}

io::RgbImage decode_latents(const at::Tensor& packed, const ckpt::ImageShape& shape, const io::ModelSources& sources) {
  io::ModelDir model(sources);
  if (model.family() == io::ModelFamily::Flux2) {
    // AutoencoderKLFlux2: unpack by position ids, de-normalise with its BatchNorm statistics.
    if (!shape.flux2)
      throw UsageError(str_cat("--decode: ", model.root(), " is a FLUX.2 pipeline, the checkpoint holds FLUX.1 latents"));
    const flux2::Vae vae = flux2::load_vae(model.source(io::Component::Vae).path, at::kFloat, at::kCPU);
    const flux::LatentGeometry g =
        flux::latent_geometry(shape.height, shape.width, vae.config().scale_factor(), vae.config().decoder.latent_channels);
    c10::InferenceMode guard;
    return vae.decode_images(packed.to(at::kFloat).unsqueeze(0), flux2::latent_ids(g)).front();
  }
  if (shape.flux2)
    throw UsageError(str_cat("--decode: ", model.root(), " is a FLUX.1 pipeline, the checkpoint holds FLUX.2 latents"));
  const io::VaeConfig& vc = model.vae_config();
  flux::LatentGeometry g = flux::latent_geometry(shape.height, shape.width, vc.scale_factor(), vc.latent_channels);
  if (g.latent_height != shape.latent_height || g.latent_width != shape.latent_width ||
      g.token_dim() != shape.token_dim)
    throw ConfigError(str_cat(model.label("vae/config.json"), ": ", vc.latent_channels, " latent channels at scale ",
                              vc.scale_factor(), " give latents of ", g.latent_height, "x", g.latent_width, "x",
                              g.channels, " for ", shape.height, "x", shape.width, " pixels; the checkpoint has ",
                              shape.latent_height, "x", shape.latent_width, "x", shape.latent_channels));
  vae::VaeDecoder vae = vae::load_vae_decoder(model, at::kFloat, at::kCPU);
  return vae::decode_image(vae, packed, g, vc);
}

}  // namespace fluxmpi::inspect
