#include "models/flux/controlnet.h"

#include <filesystem>

#include "core/error.h"
#include "io/tensor_store.h"
#include "models/common/cpu_linear.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::flux {

StridedConvImpl::StridedConvImpl(int64_t in, int64_t out, int64_t stride_) : stride(stride_) {
  weight = register_parameter("weight", nn::placeholder({out, in, 3, 3}), false);
  bias = register_parameter("bias", nn::placeholder({out}), false);
}

at::Tensor StridedConvImpl::forward(const at::Tensor& x) const {
  return nn::conv2d(x, weight, bias, {stride, stride}, {1, 1});
}

HintEmbeddingImpl::HintEmbeddingImpl(int64_t channels) {
  const int64_t c = io::kHintChannels;
  conv_in = register_module("conv_in", StridedConv(3, c, 1));
  auto list = std::make_shared<torch::nn::Module>();
  // Three levels of (16 -> 16, stride 1), (16 -> 16, stride 2): 8 pixels per output cell.
  for (int64_t i = 0; i < 6; ++i)
    blocks.push_back(list->register_module(std::to_string(i), StridedConv(c, c, i % 2 == 0 ? 1 : 2)));
  register_module("blocks", list);
  conv_out = register_module("conv_out", StridedConv(c, channels, 1));
}

at::Tensor HintEmbeddingImpl::forward(const at::Tensor& pixels) const {
  // pixels: [B, 3, H, W] in [-1, 1]
  nn::check_shape(pixels, {-1, 3, -1, -1}, "input_hint_block pixels [B, 3, H, W]");
  at::Tensor x = at::silu(conv_in->forward(pixels));
  for (const StridedConv& b : blocks) x = at::silu(b->forward(x));
  return conv_out->forward(x);
}

FluxControlNetImpl::FluxControlNetImpl(const io::ControlNetConfig& config) : config_(config) {
  const int64_t D = config.inner_dim(), heads = config.num_attention_heads, dh = config.attention_head_dim;
  time_text_embed = register_module("time_text_embed", TimeTextEmbed(D, config.pooled_projection_dim, config.guidance_embeds));
  context_embedder = register_module("context_embedder", nn::Linear(config.joint_attention_dim, D));
  x_embedder = register_module("x_embedder", nn::Linear(config.in_channels, D));
  auto doubles = std::make_shared<torch::nn::Module>();
  auto singles = std::make_shared<torch::nn::Module>();
  auto cn_doubles = std::make_shared<torch::nn::Module>();
  auto cn_singles = std::make_shared<torch::nn::Module>();
  for (int64_t i = 0; i < config.num_layers; ++i) {
    double_blocks.push_back(doubles->register_module(std::to_string(i), DoubleBlock(D, heads, dh)));
    controlnet_blocks.push_back(cn_doubles->register_module(std::to_string(i), nn::Linear(D, D)));
  }
  for (int64_t j = 0; j < config.num_single_layers; ++j) {
    single_blocks.push_back(singles->register_module(std::to_string(j), SingleBlock(D, heads, dh)));
    controlnet_single_blocks.push_back(cn_singles->register_module(std::to_string(j), nn::Linear(D, D)));
  }
  register_module("transformer_blocks", doubles);
  register_module("single_transformer_blocks", singles);
  register_module("controlnet_blocks", cn_doubles);
  register_module("controlnet_single_blocks", cn_singles);
  if (config.is_union()) controlnet_mode_embedder = register_module("controlnet_mode_embedder", nn::Embedding(*config.num_mode, D));
  if (config.takes_pixels())
    input_hint_block = register_module("input_hint_block", HintEmbedding(*config.conditioning_embedding_channels));
  controlnet_x_embedder = register_module("controlnet_x_embedder", nn::Linear(config.in_channels, D));
}

at::Tensor FluxControlNetImpl::embed_condition(const at::Tensor& control) const {
  at::Tensor cond = control;
  if (config_.takes_pixels()) {
    // [B, c, h, w] -> patches of p x p cells, features (c, dy, dx), tokens row-major.
    at::Tensor h = input_hint_block->forward(control);
    const int64_t B = h.size(0), c = h.size(1), p = config_.patch_size;
    FLUX_CHECK(h.size(2) % p == 0 && h.size(3) % p == 0, "input_hint_block output ", h.sizes(), " not a multiple of patch ", p);
    const int64_t rows = h.size(2) / p, cols = h.size(3) / p;
    cond = h.reshape({B, c, rows, p, cols, p}).permute({0, 2, 4, 1, 3, 5}).reshape({B, rows * cols, c * p * p});
  }
  nn::check_shape(cond, {-1, -1, config_.in_channels}, "ControlNet condition [B, L, in_channels]");
  return controlnet_x_embedder->forward(cond);
}

StreamState FluxControlNetImpl::embed(const ControlNetInputs& in) const {
  // latents: [B, L, C], condition: [B, L, D], text: [B, S, J], pooled: [B, P], timestep/guidance: [B]
  const int64_t B = in.latents.size(0), D = config_.inner_dim();
  nn::check_shape(in.latents, {B, -1, config_.in_channels}, "ControlNet latents [B, L, in_channels]");
  nn::check_shape(in.condition, {B, in.latents.size(1), D}, "ControlNet condition rows [B, L, D]");
  nn::check_shape(in.text, {B, -1, config_.joint_attention_dim}, "ControlNet text [B, S, joint_attention_dim]");
  StreamState s;
  s.img = x_embedder->forward(in.latents) + in.condition;
  const auto dtype = s.img.scalar_type();
  at::Tensor t = in.timestep.to(dtype) * 1000;
  at::Tensor g;
  if (config_.guidance_embeds) {
    FLUX_CHECK(in.guidance.defined(), "a ControlNet with a guidance embedder needs a guidance value");
    g = in.guidance.to(dtype) * 1000;
  }
  s.temb = time_text_embed->forward(t, g, in.pooled);
  s.txt = context_embedder->forward(in.text);
  if (config_.is_union() && in.text.size(1) > 0) {
    FLUX_CHECK(in.mode.defined() && in.mode.numel() == B, "a Union ControlNet needs one control mode per image");
    s.txt = at::cat({controlnet_mode_embedder->forward(in.mode.view({B, 1})), s.txt}, 1);
  }
  s.text_len = s.txt.size(1);
  return s;
}

RopeTables FluxControlNetImpl::rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const {
  at::Tensor txt = config_.is_union() ? at::cat({txt_ids.narrow(0, 0, 1), txt_ids}, 0) : txt_ids;
  return rope_tables(at::cat({txt, img_ids}, 0), config_.axes_dims_rope);
}

std::vector<at::Tensor> FluxControlNetImpl::run_blocks(StreamState& s, const RopeTables& rope, double scale,
                                                       std::vector<KvCache>* kv, const BlockObserver& observe) const {
  const size_t blocks = double_blocks.size() + single_blocks.size();
  FLUX_CHECK(kv == nullptr || kv->size() == blocks, "one KV cache per block: ", kv ? kv->size() : 0, " for ", blocks);
  auto cache = [&](size_t block) { return kv != nullptr ? &(*kv)[block] : nullptr; };
  std::vector<at::Tensor> samples;
  samples.reserve(blocks);
  for (size_t i = 0; i < double_blocks.size(); ++i) {
    std::tie(s.txt, s.img) = double_blocks[i]->forward(s.txt, s.img, s.temb, rope, cache(i));
    if (observe) observe("double_block_" + std::to_string(i), s);
    samples.push_back(controlnet_blocks[i]->forward(s.img) * scale);
  }
  for (size_t j = 0; j < single_blocks.size(); ++j) {
    if (!s.is_joint()) {
      s.joint = at::cat({s.txt, s.img}, 1);
      s.txt = at::Tensor();
      s.img = at::Tensor();
    }
    s.joint = single_blocks[j]->forward(s.joint, s.temb, rope, cache(double_blocks.size() + j));
    if (observe) observe("single_block_" + std::to_string(j), s);
    const at::Tensor img = s.joint.narrow(1, s.text_len, s.joint.size(1) - s.text_len).contiguous();
    samples.push_back(controlnet_single_blocks[j]->forward(img) * scale);
  }
  return samples;
}

std::vector<KvCache> FluxControlNetImpl::kv_caches(int64_t batch, int64_t tokens, const at::TensorOptions& options) const {
  std::vector<KvCache> caches(double_blocks.size() + single_blocks.size());
  for (KvCache& c : caches) {
    c = make_kv_cache(batch, tokens, config_.num_attention_heads, config_.attention_head_dim, options);
  }
  return caches;
}

void FluxControlNetImpl::fuse_projections() {
  nn::use_gemm_layout(*this);  // fp32 on the CPU: the weights as oneDNN's GEMM reads them (cpu_linear.h)
  for (auto& b : double_blocks) b->fuse();
  for (auto& b : single_blocks) b->fuse();
}

io::ControlNetConfig read_controlnet_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  return io::parse_controlnet_config(io::ConfigReader::from_file(path, str_cat("--controlnet '", dir, "': config.json")));
}

namespace {
io::TensorStore open_controlnet_weights(const std::string& dir) {
  return io::TensorStore::open_dir(dir, str_cat("--controlnet '", dir, "'"));
}
}  // namespace

void check_controlnet_weights(const std::string& dir) {
  const FluxControlNet model(read_controlnet_config(dir));
  nn::check_module(*model, open_controlnet_weights(dir), nn::LoadRules{});
}

FluxControlNet load_flux_controlnet(const std::string& dir, at::ScalarType dtype, at::Device device,
                                    nn::LoadStats* stats) {
  FluxControlNet model(read_controlnet_config(dir));
  io::TensorStore store = open_controlnet_weights(dir);
  nn::LoadStats s = nn::load_module(*model, store, nn::LoadRules{}, dtype, device);
  if (stats != nullptr) *stats = s;
  store.close();
  model->fuse_projections();
  return model;
}

}  // namespace fluxmpi::flux
