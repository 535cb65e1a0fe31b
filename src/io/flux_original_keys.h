#pragma once
/// The FLUX transformer in the original Black Forest Labs key layout (`flux1-dev.safetensors`,
/// ComfyUI's `model.diffusion_model.*`) against the diffusers layout fluxmpi's modules are named
/// by. Semantics of diffusers' `convert_flux_transformer_checkpoint_to_diffusers` (v0.40): fused
/// q|k|v (double blocks) and q|k|v|mlp (single blocks) are split along dim 0, `*.norm.*_norm.scale`
/// are the RMSNorm weights, and `final_layer.adaLN_modulation.1` stores (shift, scale) where
/// diffusers' `norm_out.linear` has (scale, shift). Widths come from the config, never from tensor
/// names. Torch-free: the loader, the LoRA converter and the tests share these tables.

#include <cstdint>
#include <string>
#include <vector>

#include "io/configs.h"

namespace fluxmpi::io {

/// A run of rows [row_begin, row_end) (along dim 0) of a tensor stored under an original-layout key.
struct OriginalRows {
  std::string original_key;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};

/// The pieces, concatenated along dim 0 in order, that make up the diffusers tensor `diffusers_key`
/// (e.g. "transformer_blocks.3.attn.to_k.weight" -> rows [D,2D) of "double_blocks.3.img_attn.qkv.weight";
/// "norm_out.linear.weight" -> rows [D,2D) then [0,D) of "final_layer.adaLN_modulation.1.weight").
/// Empty when the key has no original counterpart (including blocks beyond the config's counts and
/// the guidance embedder of a config without one). Widths come from the config.
std::vector<OriginalRows> flux_original_pieces(const std::string& diffusers_key, const TransformerConfig& config);

/// One diffusers module fed by rows of an original module's output dimension.
struct DiffusersRows {
  std::string diffusers_module;
  int64_t row_begin = 0;         ///< rows [row_begin, row_end) of the original module's output
  int64_t row_end = 0;
  int64_t target_row_begin = 0;  ///< where those rows start in the diffusers module's output
};

/// The diffusers modules an original-layout MODULE name (no .weight/.bias; e.g. "double_blocks.3.img_attn.qkv",
/// "single_blocks.7.linear1", "single_blocks.7.modulation.lin") maps to, with their row ranges in the original's
/// output dimension, in the original's row order (for fused modules: q, k, v (, mlp)). For
/// "final_layer.adaLN_modulation.1": rows [0,D) (shift) land at rows [D,2D) of "norm_out.linear" and rows
/// [D,2D) (scale) at rows [0,D). RMSNorm modules ("double_blocks.3.img_attn.norm.query_norm") map to
/// the diffusers norm ("transformer_blocks.3.attn.norm_q"). Empty if the name is not an original module
/// of this config.
std::vector<DiffusersRows> flux_original_module_targets(const std::string& original_module,
                                                        const TransformerConfig& config);

/// The parameter name an original-layout module stores for a diffusers parameter name: "scale" for
/// the RMSNorm weights ("weight" of "attn.norm_q"), otherwise the same ("weight", "bias").
/// Exposed for the tests; flux_original_pieces applies it.
bool flux_original_is_norm_module(const std::string& original_module);

/// Every original-layout key a complete transformer of `config` stores (weights, biases, norm
/// scales), in no particular order: what a file must hold, and nothing else.
std::vector<std::string> flux_original_keys(const TransformerConfig& config);

}  // namespace fluxmpi::io
