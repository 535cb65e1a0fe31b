#include "parallel/stored_weights.h"

#include <cctype>

#include "core/error.h"
#include "io/gguf.h"

namespace fluxmpi::parallel {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// The block number after `prefix`, or -1.
int64_t block_index(const std::string& key, const std::string& prefix) {
  if (!starts_with(key, prefix)) return -1;
  size_t j = prefix.size();
  int64_t n = 0;
  while (j < key.size() && std::isdigit(static_cast<unsigned char>(key[j])) && n < (int64_t{1} << 40))
    n = n * 10 + (key[j++] - '0');
  return j > prefix.size() && j < key.size() && key[j] == '.' ? n : -1;
}

}  // namespace

uint64_t StoredWeights::total() const {
  uint64_t n = embedders + final_layer;
  for (uint64_t b : double_blocks) n += b;
  for (uint64_t b : single_blocks) n += b;
  return n;
}

StoredWeights stored_weights(const io::TensorStore& store, int64_t num_double, int64_t num_single, int64_t dtype_bytes,
                             uint64_t scratch_bytes) {
  StoredWeights w;
  w.double_blocks.assign(static_cast<size_t>(num_double), 0);
  w.single_blocks.assign(static_cast<size_t>(num_single), 0);
  w.scratch_bytes = scratch_bytes;
  for (const std::string& key : store.keys()) {
    const io::TensorEntry& e = *store.get(key).entry;  // header only
    const uint64_t bytes = io::is_quantized(e.dtype) ? e.num_bytes() : e.num_elements() * static_cast<uint64_t>(dtype_bytes);
    const int64_t d = block_index(key, "transformer_blocks."), s = block_index(key, "single_transformer_blocks.");
    if (d >= 0 && d < num_double) w.double_blocks[static_cast<size_t>(d)] += bytes;
    else if (s >= 0 && s < num_single) w.single_blocks[static_cast<size_t>(s)] += bytes;
    else if (starts_with(key, "norm_out.") || starts_with(key, "proj_out.")) w.final_layer += bytes;
    else w.embedders += bytes;
  }
  return w;
}

std::optional<StoredWeights> gguf_stored_weights(const io::ModelDir& dir, int64_t num_double, int64_t num_single,
                                                 int64_t dtype_bytes, uint64_t scratch_bytes) {
  const io::ComponentSource& src = dir.source(io::Component::Transformer);
  if (!src.gguf) return std::nullopt;
  StoredWeights w = stored_weights(dir.open_weights("transformer"), num_double, num_single, dtype_bytes, scratch_bytes);
  w.label = str_cat("GGUF: ", src.quantization);
  return w;
}

}  // namespace fluxmpi::parallel
