#pragma once
/// LoRAs merged into a model's weights while they load: W' = W + sum over the LoRAs, in the order
/// given, of scale * (alpha / r) * up[rows] @ down, computed in fp32 from the stored values and
/// rounded once to the run dtype (diffusers' `fuse_lora` result). A module fused in the original
/// layout (FLUX's q|k|v, q|k|v|mlp) is one low-rank update whose rows land on several modules.
///
/// Resolution (which module each pair of a file changes, with row ranges) and the shape checks
/// against the model happen from headers alone, before any weight is read: errors are WeightErrors
/// naming the LoRA file and key. The loader hook then reads a pair's tensors only when a module it
/// changes is loaded, so a rank never reads the LoRA tensors of blocks it does not own.

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/lora_file.h"
#include "io/tensor_store.h"
#include "models/common/loader.h"

namespace fluxmpi::nn {

/// A weight [out, in] of the model, by module name ("transformer_blocks.3.attn.to_q").
using WeightShapes = std::map<std::string, std::vector<int64_t>>;
/// Every 2-D "<module>.weight" of a store's headers (text encoders: their Linear layers).
WeightShapes linear_weight_shapes(const io::TensorStore& store);

/// Rows [row_begin, row_end) of a pair's up @ down landing at row target_row_begin of a module.
struct LoraRows {
  std::string module;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t target_row_begin = 0;
};
/// The modules a kohya pair's (underscored) module name stands for; empty when it names none.
using KohyaResolver = std::function<std::vector<LoraRows>(const std::string& underscored_module)>;
/// A kohya resolver for models whose kohya names are their own module names with '.' as '_'
/// (the text encoders: lora_te1_text_model_encoder_layers_0_self_attn_q_proj).
KohyaResolver underscored_names(const WeightShapes& shapes);

/// One resolved update.
struct LoraUpdate {
  std::shared_ptr<const io::LoraFile> file;
  size_t file_index = 0;  ///< position in the run's --lora list
  size_t pair = 0;        ///< index into file->pairs()
  LoraRows rows;
};

/// The LoRAs of a run resolved against one model (the transformer, CLIP or T5).
class LoraSet {
 public:
  LoraSet() = default;
  /// Resolves the pairs of `target` in every file: diffusers names must be keys of `shapes`, kohya
  /// names go through `kohya`. Checks every pair against the shapes. Throws WeightError naming the
  /// file and key of a pair that names no module or does not fit it.
  LoraSet(const std::vector<std::shared_ptr<const io::LoraFile>>& files, io::LoraTarget target,
          const WeightShapes& shapes, const KohyaResolver& kohya);

  bool empty() const { return updates_.empty(); }
  const std::vector<LoraUpdate>& updates() const { return updates_; }
  size_t num_files() const { return num_files_; }
  /// Per file: the modules it changes that `owned` accepts (--dry-run: tensors applied per rank).
  std::vector<int64_t> count(const std::function<bool(const std::string& module)>& owned) const;
  /// Checks every pair's alpha (reads those scalars; validation on rank 0).
  void check_alphas() const;

  /// The loader hook: merges the updates of "<module>.weight" in fp32. The set's data is shared
  /// with the hook, which may outlive the set. `applied`, when given, counts the merged updates
  /// per file.
  WeightAdjust adjust(std::shared_ptr<std::vector<int64_t>> applied = nullptr) const;

 private:
  std::vector<LoraUpdate> updates_;
  size_t num_files_ = 0;
};

/// Merges `updates` (all of one module) into the fp32 weight `w` in place, in order. Exposed for tests.
void merge_updates(const std::vector<LoraUpdate>& updates, at::Tensor& w);

}  // namespace fluxmpi::nn
