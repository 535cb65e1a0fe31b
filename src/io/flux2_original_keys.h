#pragma once
/// The FLUX.2 transformer in the original Black Forest Labs key layout (flux2-dev.safetensors and
/// its GGUF conversions: `double_blocks.N.img_attn.qkv.weight`, `single_blocks.N.linear1.weight`,
/// `double_stream_modulation_img.lin.weight`, ...) against the diffusers layout fluxmpi's FLUX.2
/// modules are named by. Semantics of diffusers' `convert_flux2_transformer_checkpoint_to_diffusers`
/// (v0.40): the double blocks' fused q|k|v are cut in three along dim 0, the single blocks keep
/// their fused projections (`linear1` is `attn.to_qkv_mlp_proj`, `linear2` is `attn.to_out`),
/// `*.norm.*_norm.scale` are the RMSNorm weights, and `final_layer.adaLN_modulation.1` stores
/// (shift, scale) where `norm_out.linear` has (scale, shift). No biases. Torch-free.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/flux2_configs.h"
#include "io/flux_original_keys.h"

namespace fluxmpi::io {

/// The shape of every diffusers tensor a complete Flux2Transformer2DModel of `config` has.
std::vector<std::pair<std::string, std::vector<int64_t>>> flux2_diffusers_shapes(const Flux2TransformerConfig& config);

/// The pieces, concatenated along dim 0 in order, that make up the diffusers tensor `diffusers_key`
/// ("transformer_blocks.1.attn.to_k.weight" -> rows [D, 2D) of "double_blocks.1.img_attn.qkv.weight").
/// Empty when the key is not a tensor of the configured model.
std::vector<OriginalRows> flux2_original_pieces(const std::string& diffusers_key, const Flux2TransformerConfig& config);

}  // namespace fluxmpi::io
