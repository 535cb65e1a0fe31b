#pragma once
// The transformer's weights as the ranks hold them when a GGUF file's quantized tensors stay
// quantized (parallel::StoredWeights): read from the file's header alone, for the planner and
// --dry-run.

#include <cstdint>
#include <optional>

#include "io/model_dir.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel {

/// Per block and per part of the diffusers keys `store` presents: a block-quantized tensor's
/// stored bytes, any other tensor's elements.
StoredWeights stored_weights(const io::TensorStore& store, int64_t num_double, int64_t num_single);

/// stored_weights() of the model's transformer (of `shape`'s blocks) when it is a GGUF file;
/// nullopt otherwise (the weights are then converted to the run dtype and counted by formula).
/// Family::plan_transformer sets PlanRequest::stored with it.
std::optional<StoredWeights> gguf_stored_weights(const io::ModelDir& dir, const io::TransformerConfig& shape);

}  // namespace fluxmpi::parallel
