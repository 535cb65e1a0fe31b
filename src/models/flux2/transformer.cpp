#include "models/flux2/transformer.h"

#include <regex>

#include "core/error.h"
#include "io/tensor_store.h"
#include "models/common/cpu_linear.h"
#include "models/common/tensor_utils.h"
#include "models/flux2/latents.h"

namespace fluxmpi::flux2 {

TransformerPart whole_part(const TransformerConfig& c) { return TransformerPart{0, c.num_blocks(), true, true}; }

Flux2TransformerImpl::Flux2TransformerImpl(const TransformerConfig& config, const TransformerPart& part)
    : config_(config), part_(part) {
  const int64_t D = config.inner_dim(), B = config.num_blocks(), H = config.num_attention_heads,
                Dh = config.attention_head_dim, M = config.mlp_hidden_dim();
  FLUX_CHECK(part.first_block >= 0 && part.first_block <= part.end_block && part.end_block <= B,
             "block range [", part.first_block, ", ", part.end_block, ") outside 0..", B);
  if (part.embedders) {
    x_embedder = register_module("x_embedder", nn::Linear(config.in_channels, D, /*bias=*/false));
    context_embedder = register_module("context_embedder", nn::Linear(config.joint_attention_dim, D, /*bias=*/false));
    time_guidance_embed = register_module(
        "time_guidance_embed", TimeGuidanceEmbed(config.timestep_guidance_channels, D, config.guidance_embeds));
    double_stream_modulation_img = register_module("double_stream_modulation_img", Modulation(D, 2));
    double_stream_modulation_txt = register_module("double_stream_modulation_txt", Modulation(D, 2));
    single_stream_modulation = register_module("single_stream_modulation", Modulation(D, 1));
  }
  // Plain containers named like diffusers' ModuleLists, holding only this part's blocks under
  // their global indices.
  const int64_t L = config.num_layers;
  first_double_ = std::min(part.first_block, L);
  first_single_ = std::max<int64_t>(part.first_block - L, 0);
  auto doubles = std::make_shared<torch::nn::Module>();
  auto singles = std::make_shared<torch::nn::Module>();
  for (int64_t g = part.first_block; g < part.end_block; ++g) {
    if (g < L)
      double_blocks.push_back(doubles->register_module(std::to_string(g), DoubleBlock(D, H, Dh, M, config.eps)));
    else
      single_blocks.push_back(singles->register_module(std::to_string(g - L), SingleBlock(D, H, Dh, M, config.eps)));
  }
  if (!double_blocks.empty()) register_module("transformer_blocks", doubles);
  if (!single_blocks.empty()) register_module("single_transformer_blocks", singles);
  if (part.final_layer) {
    norm_out = register_module("norm_out", OutputNorm(D, config.eps));
    proj_out = register_module(
        "proj_out", nn::Linear(D, config.patch_size * config.patch_size * config.out_channels, /*bias=*/false));
  }
}

flux::StreamState Flux2TransformerImpl::embed(const flux::TransformerInputs& in) const {
  // latents: [B, L, C_in], text: [B, S, J], timestep/guidance: [B]
  FLUX_CHECK(part_.embedders, "this transformer part holds no embedders");
  const int64_t B = in.latents.size(0), D = config_.inner_dim();
  nn::check_shape(in.latents, {B, -1, config_.in_channels}, "transformer latents [B, L, in_channels]");
  nn::check_shape(in.text, {B, -1, config_.joint_attention_dim}, "transformer text [B, S, joint_attention_dim]");
  nn::check_shape(in.timestep, {B}, "transformer timestep [B]");
  const auto dtype = in.latents.scalar_type();
  at::Tensor t = in.timestep.to(dtype) * 1000;
  at::Tensor g;
  if (config_.guidance_embeds) {
    FLUX_CHECK(in.guidance.defined(), "a guidance-distilled FLUX.2 model needs a guidance value");
    nn::check_shape(in.guidance, {B}, "transformer guidance [B]");
    g = in.guidance.to(dtype) * 1000;
  }
  flux::StreamState s;
  s.temb = time_guidance_embed->forward(t, g);
  s.modulation = at::cat({double_stream_modulation_img->forward(s.temb), double_stream_modulation_txt->forward(s.temb),
                          single_stream_modulation->forward(s.temb)},
                         1);
  FLUX_CHECK(s.modulation.size(1) == config_.modulation_dim(), "modulation width ", s.modulation.size(1), " != 15 * ", D);
  s.img = x_embedder->forward(in.latents);
  s.txt = context_embedder->forward(in.text);
  s.text_len = in.text.size(1);
  return s;
}

at::Tensor Flux2TransformerImpl::text_position_ids(int64_t text_tokens) const {
  at::Tensor ids = at::zeros({text_tokens, 4}, at::kLong);
  ids.select(1, 3).copy_(at::arange(text_tokens, at::kLong));
  return ids;
}

at::Tensor Flux2TransformerImpl::image_position_ids(int64_t latent_height, int64_t latent_width) const {
  FLUX_CHECK(latent_height % 2 == 0 && latent_width % 2 == 0, "latent size ", latent_height, "x", latent_width,
             " is not a whole number of 2x2 patches");
  const int64_t h = latent_height / 2, w = latent_width / 2;
  at::Tensor ids = at::zeros({h * w, 4}, at::kLong);
  at::Tensor rc = at::arange(h * w, at::kLong);
  ids.select(1, 1).copy_(rc.div(w, "floor"));
  ids.select(1, 2).copy_(rc.remainder(w));
  return ids;
}

at::Tensor Flux2TransformerImpl::reference_position_ids(int64_t index, int64_t latent_height,
                                                        int64_t latent_width) const {
  FLUX_CHECK(latent_height % 2 == 0 && latent_width % 2 == 0, "reference latent size ", latent_height, "x", latent_width,
             " is not a whole number of 2x2 patches");
  return reference_ids(index, latent_height / 2, latent_width / 2);
}

flux::RopeTables Flux2TransformerImpl::rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const {
  nn::check_shape(txt_ids, {-1, 4}, "text position ids [S, 4]");
  nn::check_shape(img_ids, {-1, 4}, "image position ids [L, 4]");
  return flux::rope_tables(at::cat({txt_ids, img_ids.to(txt_ids.scalar_type())}, 0), config_.axes_dims_rope,
                           config_.rope_theta);
}

void Flux2TransformerImpl::run_blocks(flux::StreamState& s, const flux::RopeTables& rope,
                                      const flux::BlockObserver& observe, std::vector<flux::KvCache>* kv,
                                      const flux::BlockResiduals* residuals) const {
  FLUX_CHECK(residuals == nullptr, "FLUX.2 blocks take no ControlNet residuals");
  const size_t held = double_blocks.size() + single_blocks.size();
  FLUX_CHECK(kv == nullptr || kv->size() == held, "one KV cache per block: ", kv ? kv->size() : 0, " for ", held,
             " blocks");
  if (held == 0) return;
  const int64_t D = config_.inner_dim();
  FLUX_CHECK(s.modulation.defined(), "FLUX.2 blocks need the modulation vectors of the part holding the embedders");
  nn::check_shape(s.modulation, {s.temb.size(0), config_.modulation_dim()}, "stream state modulation [B, 15D]");
  const at::Tensor img_mod = s.modulation.narrow(1, 0, 6 * D), txt_mod = s.modulation.narrow(1, 6 * D, 6 * D),
                   single_mod = s.modulation.narrow(1, 12 * D, 3 * D);
  auto cache = [&](size_t block) { return kv != nullptr ? &(*kv)[block] : nullptr; };
  for (size_t i = 0; i < double_blocks.size(); ++i) {
    FLUX_CHECK(!s.is_joint(), "double block after the streams were joined");
    std::tie(s.txt, s.img) = double_blocks[i]->forward(s.txt, s.img, img_mod, txt_mod, rope, cache(i));
    if (observe) observe("double_block_" + std::to_string(first_double_ + static_cast<int64_t>(i)), s);
  }
  for (size_t i = 0; i < single_blocks.size(); ++i) {
    if (!s.is_joint()) {
      s.joint = at::cat({s.txt, s.img}, 1);
      s.txt = at::Tensor();
      s.img = at::Tensor();
    }
    s.joint = single_blocks[i]->forward(s.joint, single_mod, rope, cache(double_blocks.size() + i));
    if (observe) observe("single_block_" + std::to_string(first_single_ + static_cast<int64_t>(i)), s);
  }
}

std::vector<flux::KvCache> Flux2TransformerImpl::kv_caches(int64_t batch, int64_t tokens,
                                                           const at::TensorOptions& options) const {
  std::vector<flux::KvCache> caches(double_blocks.size() + single_blocks.size());
  for (flux::KvCache& c : caches) {
    c = flux::make_kv_cache(batch, tokens, config_.num_attention_heads, config_.attention_head_dim, options);
  }
  return caches;
}

at::Tensor Flux2TransformerImpl::final_layer(const flux::StreamState& s, at::Tensor* normed) const {
  FLUX_CHECK(part_.final_layer, "this transformer part holds no final layer");
  at::Tensor img = s.is_joint() ? s.joint.narrow(1, s.text_len, s.joint.size(1) - s.text_len) : s.img;
  at::Tensor h = norm_out->forward(img, s.temb);
  if (normed != nullptr) *normed = h;
  return proj_out->forward(h);
}

at::Tensor Flux2TransformerImpl::forward(const flux::TransformerInputs& in, const at::Tensor& txt_ids,
                                         const at::Tensor& img_ids) const {
  FLUX_CHECK(part_.embedders && part_.final_layer && part_.first_block == 0 && part_.end_block == config_.num_blocks(),
             "forward() needs the whole transformer");
  flux::StreamState s = embed(in);
  run_blocks(s, rope(txt_ids, img_ids));
  return final_layer(s);
}

bool Flux2TransformerImpl::owns_key(const std::string& key) const {
  static const std::regex block_re(R"(^(transformer_blocks|single_transformer_blocks)\.(\d+)\.)");
  std::smatch m;
  if (std::regex_search(key, m, block_re)) {
    int64_t g = std::stoll(m[2].str());
    if (m[1].str() == "single_transformer_blocks") g += config_.num_layers;
    return g >= part_.first_block && g < part_.end_block;
  }
  for (const char* p : {"norm_out.", "proj_out."})
    if (key.rfind(p, 0) == 0) return part_.final_layer;
  // The embedders, the global modulation, and any key no part would claim, are the first part's
  // to account for.
  return part_.embedders;
}

Flux2Transformer load_flux2_transformer(const std::string& transformer_dir, const TransformerPart& part,
                                        at::ScalarType dtype, at::Device device, nn::LoadStats* stats) {
  const TransformerConfig config = read_transformer_config(transformer_dir);
  io::TensorStore store = io::TensorStore::open_dir(transformer_dir, str_cat("transformer folder '", transformer_dir, "'"));
  return load_flux2_transformer(config, std::move(store), part, dtype, device, stats);
}

Flux2Transformer load_flux2_transformer(const TransformerConfig& config, io::TensorStore store,
                                        const TransformerPart& part, at::ScalarType dtype, at::Device device,
                                        nn::LoadStats* stats) {
  Flux2Transformer model(config, part);
  nn::LoadRules rules;
  rules.owned = [&model](const std::string& key) { return model->owns_key(key); };
  nn::LoadStats s = nn::load_module(*model, store, rules, dtype, device);
  if (stats != nullptr) *stats = s;
  store.close();
  nn::use_gemm_layout(*model);  // fp32 on the CPU: the weights as oneDNN's GEMM reads them (cpu_linear.h)
  return model;
}

}  // namespace fluxmpi::flux2
