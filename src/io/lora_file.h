#pragma once
/// LoRA files as FLUX users share them, read from the safetensors header alone (torch-free):
///   diffusers / PEFT: `transformer.<module>.lora_A.weight` [r, in], `.lora_B.weight` [out, r],
///                     optional `.alpha`; `text_encoder.*` (CLIP) and `text_encoder_2.*` (T5) likewise;
///   kohya / sd-scripts: `lora_unet_<original module, dots as underscores>.lora_down.weight`,
///                     `.lora_up.weight`, `.alpha`; `lora_te1_*` (CLIP), `lora_te2_*` (T5).
/// Semantics of diffusers' `loaders/lora_conversion_utils.py` (v0.40): no alpha means alpha = r,
/// the update of a module is scale * (alpha / r) * up @ down.
///
/// This layer only groups the keys into (down, up, alpha) pairs and checks what the file alone can
/// tell (layout, dtypes, ranks); which model module a pair names is decided by the model layer
/// (models/common/lora.h, models/flux/lora_targets.h).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace fluxmpi::io {

/// One `--lora FILE[:SCALE]`.
struct LoraSpec {
  std::string path;
  double scale = 1.0;

  bool operator==(const LoraSpec& o) const { return path == o.path && scale == o.scale; }
  bool operator!=(const LoraSpec& o) const { return !(*this == o); }
};

/// "FILE[:SCALE]": the text after the last ':' is the scale when it is a number; otherwise (or
/// without ':') the whole text is the file and the scale is 1. Throws UsageError "'<text>': ..." when
/// the file part is empty or the scale is not finite.
LoraSpec parse_lora_spec(const std::string& text);
/// "FILE:SCALE" with the shortest decimal that reads back as the same double.
std::string lora_spec_text(const LoraSpec& spec);

/// JSON array [{"file": ..., "scale": ...}, ...] (checkpoint attribute, PNG text chunk) and back;
/// nullopt when the text is not such an array.
std::string loras_to_json(const std::vector<LoraSpec>& loras);
std::optional<std::vector<LoraSpec>> loras_from_json(const std::string& text);

enum class LoraLayout { Diffusers, Kohya };
const char* lora_layout_name(LoraLayout layout);

/// The model a LoRA pair belongs to.
enum class LoraTarget { Transformer, Clip, T5 };
const char* lora_target_name(LoraTarget target);

/// One low-rank pair of the file.
struct LoraPair {
  std::string stem;    ///< the keys' common stem in the file ("transformer.transformer_blocks.3.attn.to_q")
  LoraTarget target = LoraTarget::Transformer;
  /// The module as the file names it, without the target's prefix: a diffusers / transformers name
  /// ("transformer_blocks.3.attn.to_q") for the diffusers layout, the underscored name
  /// ("double_blocks_3_img_attn_qkv") for kohya.
  std::string module;
  const TensorEntry* down = nullptr;   ///< [r, in]
  const TensorEntry* up = nullptr;     ///< [out, r]
  const TensorEntry* alpha = nullptr;  ///< scalar (or [1]); null: alpha = r

  int64_t rank() const { return down->shape[0]; }
  int64_t in_features() const { return down->shape[1]; }
  int64_t out_features() const { return up->shape[0]; }
};

class LoraFile {
 public:
  /// Maps the file and parses its header; reads no tensor data. Throws WeightError naming the file
  /// and the key for: a key of neither layout, keys of both layouts, a pair without its down or up
  /// tensor, a dtype other than F32/F16/BF16, down/up not 2-D or of different ranks, an alpha that
  /// is not a scalar. A file without any pair is an error too.
  explicit LoraFile(const LoraSpec& spec);

  const LoraSpec& spec() const { return spec_; }
  const std::string& path() const { return spec_.path; }
  LoraLayout layout() const { return layout_; }
  const std::vector<LoraPair>& pairs() const { return pairs_; }
  const SafetensorsFile& file() const { return *file_; }

  /// The pair's alpha (r when the file stores none); reads the scalar's bytes. Throws WeightError
  /// when it is not finite.
  double alpha(const LoraPair& pair) const;
  /// scale * alpha / r: the factor of up @ down.
  double factor(const LoraPair& pair) const { return spec_.scale * alpha(pair) / static_cast<double>(pair.rank()); }
  /// "<file>: '<key>'" for messages.
  std::string where(const std::string& key) const;

 private:
  LoraSpec spec_;
  std::shared_ptr<SafetensorsFile> file_;
  LoraLayout layout_ = LoraLayout::Diffusers;
  std::vector<LoraPair> pairs_;
};

}  // namespace fluxmpi::io
