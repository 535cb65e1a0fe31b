#pragma once
/// LoRAs on the FLUX transformer: the linear layers a LoRA may change (diffusers names, shapes from
/// the config alone, so rank 0 checks LoRAs before any weight is read), the kohya names of the
/// original Black Forest Labs modules resolved to them (fused q|k|v and q|k|v|mlp split by rows,
/// diffusers' `_convert_kohya_flux_lora_to_diffusers` semantics), and which rank owns each module.

#include <memory>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/lora_file.h"
#include "models/common/lora.h"

namespace fluxmpi::flux {

/// Every linear layer of the whole transformer of `config`: module name -> weight shape [out, in].
nn::WeightShapes flux_linear_shapes(const io::TransformerConfig& config);

/// kohya `lora_unet_*` module names (the original module with '.' as '_', e.g.
/// "double_blocks_3_img_attn_qkv") -> the diffusers modules and rows they change.
nn::KohyaResolver flux_kohya_resolver(const io::TransformerConfig& config);

/// The transformer updates of `files`, resolved and shape-checked (WeightError naming file and key).
nn::LoraSet flux_lora_set(const std::vector<std::shared_ptr<const io::LoraFile>>& files,
                          const io::TransformerConfig& config);

}  // namespace fluxmpi::flux
