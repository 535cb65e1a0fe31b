#include "models/flux/transformer.h"

#include <regex>

#include "core/error.h"
#include "models/common/cpu_linear.h"
#include "models/common/tensor_utils.h"
#include "models/flux/latents.h"

namespace fluxmpi::flux {

TransformerPart TransformerPart::whole(const io::TransformerConfig& c) {
  return TransformerPart{0, c.num_blocks(), true, true};
}

FluxTransformerImpl::FluxTransformerImpl(const io::TransformerConfig& config, const TransformerPart& part)
    : config_(config), part_(part) {
  const int64_t D = config.inner_dim(), B = config.num_blocks();
  FLUX_CHECK(part.first_block >= 0 && part.first_block <= part.end_block && part.end_block <= B,
             "block range [", part.first_block, ", ", part.end_block, ") outside 0..", B);
  if (part.embedders) {
    x_embedder = register_module("x_embedder", nn::Linear(config.in_channels, D));
    context_embedder = register_module("context_embedder", nn::Linear(config.joint_attention_dim, D));
    time_text_embed =
        register_module("time_text_embed", TimeTextEmbed(D, config.pooled_projection_dim, config.guidance_embeds));
  }
  // Plain containers named like diffusers' ModuleLists, holding only this part's blocks under
  // their global indices.
  const int64_t L = config.num_layers;
  first_double_ = std::min(part.first_block, L);
  first_single_ = std::max<int64_t>(part.first_block - L, 0);
  auto doubles = std::make_shared<torch::nn::Module>();
  auto singles = std::make_shared<torch::nn::Module>();
  for (int64_t g = part.first_block; g < part.end_block; ++g) {
    if (g < L) {
      double_blocks.push_back(doubles->register_module(
          std::to_string(g), DoubleBlock(D, config.num_attention_heads, config.attention_head_dim)));
    } else {
      single_blocks.push_back(singles->register_module(
          std::to_string(g - L), SingleBlock(D, config.num_attention_heads, config.attention_head_dim)));
    }
  }
  if (!double_blocks.empty()) register_module("transformer_blocks", doubles);
  if (!single_blocks.empty()) register_module("single_transformer_blocks", singles);
  if (part.final_layer) {
    norm_out = register_module("norm_out", AdaNorm(D, 2));
    proj_out = register_module("proj_out", nn::Linear(D, config.patch_size * config.patch_size * config.out_channels));
  }
}

StreamState FluxTransformerImpl::embed(const TransformerInputs& in) const {
  // latents: [B, L, C_in], text: [B, S, J], pooled: [B, P], timestep/guidance: [B]
  FLUX_CHECK(part_.embedders, "this transformer part holds no embedders");
  const int64_t B = in.latents.size(0);
  nn::check_shape(in.latents, {B, -1, config_.in_channels}, "transformer latents [B, L, in_channels]");
  nn::check_shape(in.text, {B, -1, config_.joint_attention_dim}, "transformer text [B, S, joint_attention_dim]");
  nn::check_shape(in.pooled, {B, config_.pooled_projection_dim}, "transformer pooled [B, pooled_projection_dim]");
  StreamState s;
  s.img = x_embedder->forward(in.latents);
  const auto dtype = s.img.scalar_type();
  at::Tensor t = in.timestep.to(dtype) * 1000;
  at::Tensor g;
  if (config_.guidance_embeds) {
    FLUX_CHECK(in.guidance.defined(), "a guidance-distilled model needs a guidance value");
    g = in.guidance.to(dtype) * 1000;
  }
  s.temb = time_text_embed->forward(t, g, in.pooled);
  s.txt = context_embedder->forward(in.text);
  s.text_len = in.text.size(1);
  return s;
}

at::Tensor FluxTransformerImpl::text_position_ids(int64_t text_tokens) const {
  return flux::text_position_ids(text_tokens);
}

at::Tensor FluxTransformerImpl::image_position_ids(int64_t latent_height, int64_t latent_width) const {
  return flux::image_position_ids(latent_height, latent_width);
}

at::Tensor FluxTransformerImpl::reference_position_ids(int64_t index, int64_t latent_height, int64_t latent_width) const {
  FLUX_CHECK(index == 0, "FLUX.1 (Kontext) takes one reference image, not reference ", index);
  return flux::reference_position_ids(latent_height, latent_width);
}

RopeTables FluxTransformerImpl::rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const {
  return rope_tables(at::cat({txt_ids, img_ids}, 0), config_.axes_dims_rope);
}

void FluxTransformerImpl::run_blocks(StreamState& s, const RopeTables& rope, const BlockObserver& observe,
                                     std::vector<KvCache>* kv, const BlockResiduals* residuals) const {
  const size_t blocks = double_blocks.size() + single_blocks.size();
  FLUX_CHECK(kv == nullptr || kv->size() == blocks, "one KV cache per block: ", kv ? kv->size() : 0, " for ", blocks, " blocks");
  FLUX_CHECK(residuals == nullptr || residuals->size() == blocks, "one residual entry per block: ", residuals ? residuals->size() : 0,
             " for ", blocks, " blocks");
  auto cache = [&](size_t block) { return kv != nullptr ? &(*kv)[block] : nullptr; };
  // The block's residual, or an undefined tensor.
  auto residual = [&](size_t block) { return residuals != nullptr ? (*residuals)[block] : at::Tensor(); };
  for (size_t i = 0; i < double_blocks.size(); ++i) {
    FLUX_CHECK(!s.is_joint(), "double block after the streams were joined");
    std::tie(s.txt, s.img) = double_blocks[i]->forward(s.txt, s.img, s.temb, rope, cache(i));
    if (const at::Tensor r = residual(i); r.defined()) s.img = s.img + r;
    if (observe) observe("double_block_" + std::to_string(first_double_ + static_cast<int64_t>(i)), s);
  }
  for (size_t i = 0; i < single_blocks.size(); ++i) {
    if (!s.is_joint()) {
      s.joint = at::cat({s.txt, s.img}, 1);
      s.txt = at::Tensor();
      s.img = at::Tensor();
    }
    s.joint = single_blocks[i]->forward(s.joint, s.temb, rope, cache(double_blocks.size() + i));
    if (const at::Tensor r = residual(double_blocks.size() + i); r.defined())
      s.joint.narrow(1, s.text_len, s.joint.size(1) - s.text_len).add_(r);
    if (observe) observe("single_block_" + std::to_string(first_single_ + static_cast<int64_t>(i)), s);
  }
}

std::vector<KvCache> FluxTransformerImpl::kv_caches(int64_t batch, int64_t tokens, const at::TensorOptions& options) const {
  std::vector<KvCache> caches(double_blocks.size() + single_blocks.size());
  for (KvCache& c : caches) {
    c = make_kv_cache(batch, tokens, config_.num_attention_heads, config_.attention_head_dim, options);
  }
  return caches;
}

at::Tensor FluxTransformerImpl::final_layer(const StreamState& s, at::Tensor* normed) const {
  FLUX_CHECK(part_.final_layer, "this transformer part holds no final layer");
  at::Tensor img = s.is_joint() ? s.joint.narrow(1, s.text_len, s.joint.size(1) - s.text_len) : s.img;
  auto c = norm_out->chunks(s.temb);  // AdaLayerNormContinuous: scale first, then shift
  at::Tensor h = modulate(img, /*shift=*/c[1], /*scale=*/c[0]);
  if (normed != nullptr) *normed = h;
  return proj_out->forward(h);
}

at::Tensor FluxTransformerImpl::forward(const TransformerInputs& in, const at::Tensor& txt_ids,
                                        const at::Tensor& img_ids) const {
  FLUX_CHECK(part_.embedders && part_.final_layer && part_.first_block == 0 &&
                 part_.end_block == config_.num_blocks(),
             "forward() needs the whole transformer");
  StreamState s = embed(in);
  run_blocks(s, rope(txt_ids, img_ids));
  return final_layer(s);
}

void FluxTransformerImpl::fuse_projections() {
  // The fused weights are written in the GEMM's layout directly; then the others are transposed
  // (fp32 on the CPU: the weights as oneDNN's GEMM reads them, cpu_linear.h).
  for (auto& b : double_blocks) b->fuse();
  for (auto& b : single_blocks) b->fuse();
  nn::use_gemm_layout(*this);
}

bool FluxTransformerImpl::owns_key(const std::string& key) const {
  static const std::regex block_re(R"(^(transformer_blocks|single_transformer_blocks)\.(\d+)\.)");
  std::smatch m;
  if (std::regex_search(key, m, block_re)) {
    int64_t g = std::stoll(m[2].str());
    if (m[1].str() == "single_transformer_blocks") g += config_.num_layers;
    return g >= part_.first_block && g < part_.end_block;
  }
  for (const char* p : {"norm_out.", "proj_out."})
    if (key.rfind(p, 0) == 0) return part_.final_layer;
  // The embedders, and any key no part would claim, are rank 0's to account for.
  return part_.embedders;
}

FluxTransformer load_flux_transformer(const io::ModelDir& dir, const TransformerPart& part, at::ScalarType dtype,
                                      at::Device device, nn::LoadStats* stats, const nn::WeightAdjust& adjust) {
  io::TensorStore store = dir.open_weights("transformer");
  FluxTransformer model(dir.transformer_config(), part);
  nn::LoadRules rules;
  rules.owned = [&model](const std::string& key) { return model->owns_key(key); };
  rules.adjust = adjust;
  nn::LoadStats s = nn::load_module(*model, store, rules, dtype, device);
  if (stats != nullptr) *stats = s;
  store.close();
  model->fuse_projections();
  return model;
}

}  // namespace fluxmpi::flux
