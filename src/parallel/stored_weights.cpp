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

uint64_t StoredWeights::total(int64_t dtype_bytes) const {
  uint64_t n = embedders.bytes(dtype_bytes) + final_layer.bytes(dtype_bytes);
  for (const Part& b : double_blocks) n += b.bytes(dtype_bytes);
  for (const Part& b : single_blocks) n += b.bytes(dtype_bytes);
  return n;
}

StoredWeights stored_weights(const io::TensorStore& store, int64_t num_double, int64_t num_single) {
  StoredWeights w;
  w.double_blocks.assign(static_cast<size_t>(num_double), {});
  w.single_blocks.assign(static_cast<size_t>(num_single), {});
  for (const std::string& key : store.keys()) {
    const io::TensorEntry& e = *store.get(key).entry;  // header only
    const int64_t d = block_index(key, "transformer_blocks."), s = block_index(key, "single_transformer_blocks.");
    StoredWeights::Part& part = d >= 0 && d < num_double   ? w.double_blocks[static_cast<size_t>(d)]
                                : s >= 0 && s < num_single ? w.single_blocks[static_cast<size_t>(s)]
                                : starts_with(key, "norm_out.") || starts_with(key, "proj_out.") ? w.final_layer
                                                                                                 : w.embedders;
    if (io::is_quantized(e.dtype)) part.quantized_bytes += e.num_bytes();
    else part.dense_elements += e.num_elements();
  }
  return w;
}

std::optional<StoredWeights> gguf_stored_weights(const io::ModelDir& dir, const io::TransformerConfig& shape) {
  const io::ComponentSource& src = dir.source(io::Component::Transformer);
  if (!src.gguf) return std::nullopt;
  StoredWeights w = stored_weights(dir.open_weights("transformer"), shape.num_layers, shape.num_single_layers);
  w.label = str_cat("GGUF: ", src.quantization);
  return w;
}

}  // namespace fluxmpi::parallel
