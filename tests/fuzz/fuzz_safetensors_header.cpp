// libFuzzer target: io::parse_safetensors_header on arbitrary bytes (the whole "file").
// Contract: it returns a header whose every entry lies inside the data section and matches its
// dtype and shape, or throws WeightError. Anything else (another exception, a crash, a sanitizer
// report, a broken invariant) is a bug.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

// A broken invariant aborts, which libFuzzer and the replay test both report with the input.
void require(bool ok) {
  if (!ok) std::abort();
}

void check_header(const fluxmpi::io::SafetensorsHeader& h, size_t size) {
  require(h.data_offset >= 8 && h.data_offset <= size);
  const uint64_t data_size = size - h.data_offset;
  uint64_t covered = 0;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const auto& e = h.tensors[i];
    require(i == 0 || h.tensors[i - 1].name < e.name);  // sorted, no duplicates
    require(e.begin <= e.end && e.end <= data_size);
    require(e.num_elements() * fluxmpi::io::dtype_size(e.dtype) == e.num_bytes());
    require(h.find(e.name) == &e);
    covered += e.num_bytes();
  }
  require(covered == data_size);  // the tensors tile the data section
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check_header(fluxmpi::io::parse_safetensors_header(data, size, "fuzz.safetensors"), size);
  } catch (const fluxmpi::WeightError&) {
    // The documented rejection.
  }
  return 0;
}
