#include "io/controlnet_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {

ControlNetConfig parse_controlnet_config(const ConfigReader& r) {
  ControlNetConfig c;
  const std::string cls = r.string("_class_name", "FluxControlNetModel");
  if (cls != "FluxControlNetModel")
    r.fail("_class_name", str_cat("must be \"FluxControlNetModel\" (a FLUX ControlNet in the diffusers layout), got \"",
                                  cls, "\""));
  c.patch_size = r.positive("patch_size", c.patch_size);
  c.in_channels = r.positive("in_channels", c.in_channels);
  c.num_layers = r.integer("num_layers", c.num_layers, 0);
  c.num_single_layers = r.integer("num_single_layers", c.num_single_layers, 0);
  c.attention_head_dim = r.positive("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = r.positive("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = r.positive("joint_attention_dim", c.joint_attention_dim);
  c.pooled_projection_dim = r.positive("pooled_projection_dim", c.pooled_projection_dim);
  c.guidance_embeds = r.boolean("guidance_embeds", c.guidance_embeds);
  c.axes_dims_rope = r.integer_list("axes_dims_rope", c.axes_dims_rope, 0);
  if (r.has("num_mode")) c.num_mode = r.positive("num_mode", 1);
  if (r.has("conditioning_embedding_channels"))
    c.conditioning_embedding_channels = r.positive("conditioning_embedding_channels", kHintChannels);
  c.json_text = r.text();

  if (c.in_channels % 4 != 0)
    r.fail("in_channels", str_cat("must be a multiple of 4 (packed 2x2 latent patches), got ", c.in_channels));
  if (c.num_blocks() < 1) r.fail("num_layers", "and 'num_single_layers' are both 0: the ControlNet has no blocks");
  int64_t rope_sum = 0;
  for (int64_t d : c.axes_dims_rope) {
    if (d <= 0 || d % 2 != 0) r.fail("axes_dims_rope", str_cat("entries must be positive and even, got ", d));
    rope_sum += d;
  }
  if (c.axes_dims_rope.size() != 3)
    r.fail("axes_dims_rope", str_cat("must have 3 entries (one per position id axis), got ", c.axes_dims_rope.size()));
  if (rope_sum != c.attention_head_dim)
    r.fail("axes_dims_rope", str_cat("must sum to attention_head_dim (", c.attention_head_dim, "), got ", rope_sum));
  if (c.takes_pixels() && *c.conditioning_embedding_channels * c.patch_size * c.patch_size != c.in_channels)
    r.fail("conditioning_embedding_channels",
           str_cat("times patch_size^2 (", c.patch_size, "^2) must equal in_channels (", c.in_channels,
                   "): input_hint_block's patches are the tokens' features, got ", *c.conditioning_embedding_channels));
  return c;
}

std::string to_json(const ControlNetConfig& c) {
  auto optional = [](const std::optional<int64_t>& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(); };
  nlohmann::ordered_json j = {{"_class_name", "FluxControlNetModel"},
                              {"attention_head_dim", c.attention_head_dim},
                              {"axes_dims_rope", c.axes_dims_rope},
                              {"conditioning_embedding_channels", optional(c.conditioning_embedding_channels)},
                              {"guidance_embeds", c.guidance_embeds},
                              {"in_channels", c.in_channels},
                              {"joint_attention_dim", c.joint_attention_dim},
                              {"num_attention_heads", c.num_attention_heads},
                              {"num_layers", c.num_layers},
                              {"num_mode", optional(c.num_mode)},
                              {"num_single_layers", c.num_single_layers},
                              {"patch_size", c.patch_size},
                              {"pooled_projection_dim", c.pooled_projection_dim}};
  return j.dump(2) + "\n";
}

void check_controlnet_fits(const ControlNetConfig& n, const TransformerConfig& t, int64_t vae_scale_factor,
                           const std::string& label) {
  auto fail = [&](const std::string& key, int64_t ours, const std::string& what, int64_t theirs) {
    throw ConfigError(str_cat(label, ": '", key, "' ", ours, " does not fit the transformer: ", what, " is ", theirs));
  };
  if (n.inner_dim() != t.inner_dim())
    throw ConfigError(str_cat(label, ": its stream width num_attention_heads x attention_head_dim = ",
                              n.num_attention_heads, " x ", n.attention_head_dim, " = ", n.inner_dim(),
                              " does not fit the transformer: its residuals are added to hidden states of width ",
                              t.num_attention_heads, " x ", t.attention_head_dim, " = ", t.inner_dim()));
  if (n.joint_attention_dim != t.joint_attention_dim)
    fail("joint_attention_dim", n.joint_attention_dim, "the prompt embeddings' width (the transformer's joint_attention_dim)",
         t.joint_attention_dim);
  if (n.pooled_projection_dim != t.pooled_projection_dim)
    fail("pooled_projection_dim", n.pooled_projection_dim, "the pooled prompt embedding's width", t.pooled_projection_dim);
  if (n.in_channels != t.out_channels)
    fail("in_channels", n.in_channels, "the packed latents' features (the transformer's out_channels)", t.out_channels);
  if (!n.takes_pixels()) {
    // Without repetition, samples beyond the blocks' count would feed no block: a ControlNet made
    // for a deeper transformer.
    if (n.num_layers > t.num_layers)
      fail("num_layers", n.num_layers, "the number of double blocks its residuals feed (the transformer's num_layers)",
           t.num_layers);
  } else {
    if (n.num_layers > 0 && t.num_layers == 0)
      fail("num_layers", n.num_layers, "the number of double blocks its residuals feed (the transformer's num_layers)",
           t.num_layers);
    if (kHintDownsample * n.patch_size != 2 * vae_scale_factor)
      fail("patch_size", n.patch_size,
           str_cat("input_hint_block makes one cell of ", kHintDownsample,
                   " pixels, so its tokens are the latent tokens only when ", kHintDownsample,
                   " x patch_size = 2 x the VAE's scale factor, which"),
           vae_scale_factor);
  }
  if (n.num_single_layers > t.num_single_layers)
    fail("num_single_layers", n.num_single_layers,
         "the number of single blocks its residuals feed (the transformer's num_single_layers)", t.num_single_layers);
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int64_t ResidualLayout::sample_of_block(int64_t block, const TransformerConfig& t) const {
  FLUX_CHECK(block >= 0 && block < t.num_blocks(), "block ", block, " of ", t.num_blocks());
  if (block < t.num_layers) {
    if (double_samples == 0) return -1;
    if (repeat) return block % double_samples;
    return block / ceil_div(t.num_layers, double_samples);
  }
  if (single_samples == 0) return -1;
  const int64_t j = block - t.num_layers;
  return double_samples + j / ceil_div(t.num_single_layers, single_samples);
}

std::vector<int64_t> ResidualLayout::samples_of_blocks(int64_t first, int64_t last, const TransformerConfig& t) const {
  std::vector<int64_t> out;
  for (int64_t b = first; b <= last; ++b) {
    const int64_t s = sample_of_block(b, t);
    if (s >= 0 && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

ResidualLayout merged_layout(const std::vector<const ControlNetConfig*>& runs) {
  ResidualLayout l;
  FLUX_CHECK(!runs.empty(), "merged_layout of no ControlNet");
  l.double_samples = runs[0]->num_layers;
  l.single_samples = runs[0]->num_single_layers;
  l.repeat = runs[0]->takes_pixels();
  for (size_t i = 1; i < runs.size(); ++i) {
    if (l.double_samples > 0 && runs[i]->num_layers > 0) l.double_samples = std::min(l.double_samples, runs[i]->num_layers);
    if (l.single_samples > 0 && runs[i]->num_single_layers > 0)
      l.single_samples = std::min(l.single_samples, runs[i]->num_single_layers);
  }
  return l;
}

}  // namespace fluxmpi::io
