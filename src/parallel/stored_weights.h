#pragma once
// The transformer's weights as the ranks hold them when a GGUF file's quantized tensors stay
// quantized (parallel::StoredWeights): read from the file's header alone, for the planner and
// --dry-run.

#include <cstdint>
#include <optional>

#include "io/model_dir.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel {

/// Bytes per block and per part of the diffusers keys `store` presents: a block-quantized tensor
/// at its stored bytes, any other at its elements x `dtype_bytes`. `scratch_bytes` is copied into
/// the result (the dequantization's working memory, from the caller that knows it).
StoredWeights stored_weights(const io::TensorStore& store, int64_t num_double, int64_t num_single, int64_t dtype_bytes,
                             uint64_t scratch_bytes);

/// stored_weights() of the model's transformer when it is a GGUF file; nullopt otherwise (the
/// weights are then converted to the run dtype and counted by formula).
std::optional<StoredWeights> gguf_stored_weights(const io::ModelDir& dir, int64_t num_double, int64_t num_single,
                                                 int64_t dtype_bytes, uint64_t scratch_bytes);

}  // namespace fluxmpi::parallel
