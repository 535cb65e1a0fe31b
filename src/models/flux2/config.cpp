#include "models/flux2/config.h"

#include <filesystem>

#include "core/error.h"

namespace fluxmpi::flux2 {

namespace {

void require(const io::ConfigReader& r, const char* key) {
  if (!r.has(key)) r.fail(key, "is missing (Flux2Transformer2DModel configs name every field)");
}

}  // namespace

TransformerConfig parse_transformer_config(const io::ConfigReader& r) {
  const std::string cls = r.string("_class_name", "");
  if (cls != kTransformerClass)
    r.fail("_class_name", str_cat("must be \"", kTransformerClass, "\" (a FLUX.2 transformer), got \"", cls, "\""));
  for (const char* key : {"patch_size", "in_channels", "num_layers", "num_single_layers", "attention_head_dim",
                          "num_attention_heads", "joint_attention_dim", "timestep_guidance_channels", "mlp_ratio",
                          "axes_dims_rope", "rope_theta", "eps", "guidance_embeds"})
    require(r, key);
  TransformerConfig c;
  c.patch_size = r.positive("patch_size", c.patch_size);
  c.in_channels = r.positive("in_channels", c.in_channels);
  c.out_channels = r.positive("out_channels", c.in_channels);
  c.num_layers = r.integer("num_layers", c.num_layers, 0);
  c.num_single_layers = r.integer("num_single_layers", c.num_single_layers, 0);
  c.attention_head_dim = r.positive("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = r.positive("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = r.positive("joint_attention_dim", c.joint_attention_dim);
  c.timestep_guidance_channels = r.positive("timestep_guidance_channels", c.timestep_guidance_channels);
  c.mlp_ratio = r.positive_number("mlp_ratio", c.mlp_ratio);
  c.axes_dims_rope = r.integer_list("axes_dims_rope", c.axes_dims_rope, 0);
  c.rope_theta = r.positive_number("rope_theta", c.rope_theta);
  c.eps = r.positive_number("eps", c.eps);
  c.guidance_embeds = r.boolean("guidance_embeds", c.guidance_embeds);
  c.json_text = r.text();

  // The pipeline packs 2x2 latent patches into the channels itself (Flux2Pipeline._patchify_latents).
  if (c.patch_size != 1) r.fail("patch_size", str_cat("must be 1 (FLUX.2 patchifies the latents itself), got ", c.patch_size));
  if (c.in_channels % 4 != 0)
    r.fail("in_channels", str_cat("must be a multiple of 4 (patchified 2x2 latents), got ", c.in_channels));
  if (c.num_blocks() < 1) r.fail("num_layers", "and 'num_single_layers' are both 0: the transformer has no blocks");
  if (c.timestep_guidance_channels % 2 != 0)
    r.fail("timestep_guidance_channels", str_cat("must be even (cos and sin halves), got ", c.timestep_guidance_channels));
  if (c.mlp_hidden_dim() < 1) r.fail("mlp_ratio", str_cat("gives an empty feed-forward (", c.mlp_ratio, ")"));
  if (c.axes_dims_rope.size() != 4)
    r.fail("axes_dims_rope", str_cat("must have 4 entries (position axes T, H, W, L), got ", c.axes_dims_rope.size()));
  int64_t rope_sum = 0;
  for (int64_t d : c.axes_dims_rope) {
    if (d <= 0 || d % 2 != 0) r.fail("axes_dims_rope", str_cat("entries must be positive and even, got ", d));
    rope_sum += d;
  }
  if (rope_sum != c.attention_head_dim)
    r.fail("axes_dims_rope", str_cat("must sum to attention_head_dim (", c.attention_head_dim, "), got ", rope_sum));
  return c;
}

TransformerConfig read_transformer_config(const std::string& transformer_dir) {
  const std::string path = (std::filesystem::path(transformer_dir) / "config.json").string();
  return parse_transformer_config(
      io::ConfigReader::from_file(path, str_cat("transformer folder '", transformer_dir, "': config.json")));
}

}  // namespace fluxmpi::flux2
