// libFuzzer target: io::parse_gguf_header on arbitrary bytes (the whole "file").
// Contract: it returns a header whose every tensor lies inside the data section, matches its type
// and dims, and overlaps no other, or throws WeightError. Anything else (another exception, a
// crash, a sanitizer report, a broken invariant) is a bug.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "io/dequantize.h"
#include "io/gguf.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

void check_header(const fluxmpi::io::GgufHeader& h, const uint8_t* data, size_t size) {
  using namespace fluxmpi::io;
  require(h.index.data_offset <= size && h.index.data_offset % h.alignment == 0);
  const uint64_t data_size = size - h.index.data_offset;
  require(h.index.tensors.size() == h.tensors.size());
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (size_t i = 0; i < h.index.tensors.size(); ++i) {
    const TensorEntry& e = h.index.tensors[i];
    require(i == 0 || h.index.tensors[i - 1].name < e.name);
    require(e.begin <= e.end && e.end <= data_size && e.begin % h.alignment == 0);
    require(!e.shape.empty() && e.shape.size() <= 4);
    const uint64_t block = block_elements(e.dtype);
    require(static_cast<uint64_t>(e.shape.back()) % block == 0);
    require(e.num_elements() / block * block_bytes(e.dtype) == e.num_bytes());
    ranges.emplace_back(e.begin, e.end);
    // Dequantizing the first row reads only the tensor's own bytes (ASan checks it).
    const int64_t cols = e.shape.back();
    if (e.num_bytes() > 0 && cols > 0 && cols <= 4096) {
      std::vector<float> row(static_cast<size_t>(cols));
      dequantize_rows(e.dtype, data + h.index.data_offset + e.begin, 1, cols, row.data(), cols);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) require(ranges[i].first >= ranges[i - 1].second);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check_header(fluxmpi::io::parse_gguf_header(data, size, "fuzz.gguf"), data, size);
  } catch (const fluxmpi::WeightError&) {
    // The documented rejection.
  }
  return 0;
}
