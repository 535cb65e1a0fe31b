#include "parallel/text_split.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/units.h"
#include "parallel/param_formulas.h"
#include "parallel/plan_text.h"

namespace fluxmpi::parallel {

using detail::llm_text_activation_bytes;
using detail::range_text;

namespace {

constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

uint64_t to_bytes(int64_t elements, int64_t dtype_bytes) { return static_cast<uint64_t>(elements * dtype_bytes); }

uint64_t budget_of(const std::map<int, uint64_t>& budgets, int rank) {
  auto it = budgets.find(rank);
  return it == budgets.end() ? kUnbounded : it->second;
}

// The costs of one candidate split into k slices, everything but the layers themselves.
struct SliceCosts {
  const LlmEncoderCosts& llm;
  int64_t dtype_bytes;
  int64_t text_tokens;
  uint64_t rank0_job_bytes;
  int64_t attention_chunk_bytes;

  uint64_t layer_bytes() const { return to_bytes(llm.shape.layer_params(), dtype_bytes); }
  uint64_t embedding_bytes() const { return to_bytes(llm.shape.params(0, false), dtype_bytes); }
  uint64_t norm_bytes() const { return to_bytes(llm.shape.hidden_size, dtype_bytes); }
  // Split, a rank also holds the received hidden states and one outstanding send of its own
  // ([S, H] each), as a transformer stage does (kMessageTensors).
  uint64_t activation_bytes(bool split) const {
    return llm_text_activation_bytes(llm.shape, text_tokens, dtype_bytes, attention_chunk_bytes) +
           (split ? to_bytes(kMessageTensors * text_tokens * llm.shape.hidden_size, dtype_bytes) : 0);
  }

  // Slice `index` of `k` holding `layers` layers, rank == index.
  TextSlice slice(int index, int k, int64_t first, int64_t layers) const {
    TextSlice s;
    s.rank = index;
    s.first_layer = first;
    s.end_layer = first + layers;
    s.embeddings = index == 0;
    s.final_norm = llm.final_norm && index == k - 1;
    s.weight_bytes = layers * layer_bytes() + (s.embeddings ? embedding_bytes() : 0) + (s.final_norm ? norm_bytes() : 0);
    s.activation_bytes = activation_bytes(k > 1);
    s.job_bytes = index == 0 ? rank0_job_bytes : 0;
    s.peak_bytes = kRuntimeBaselineBytes + s.weight_bytes + s.activation_bytes + s.job_bytes;
    return s;
  }

  // How many layers slice `index` of `k` can hold within `budget`.
  int64_t capacity(int index, int k, uint64_t budget) const {
    if (budget == kUnbounded) return llm.layers;
    const uint64_t fixed = slice(index, k, 0, 0).peak_bytes;
    if (budget < fixed) return 0;
    return std::min<int64_t>(llm.layers, static_cast<int64_t>((budget - fixed) / std::max<uint64_t>(layer_bytes(), 1)));
  }
};

// Layer counts for k slices within `caps`, the largest count as small as possible; the counts
// above the others' give way from rank 0 upward (it carries the embeddings and the job's
// buffers). Empty when the caps cannot hold `layers` with at least one layer each.
std::vector<int64_t> balanced_counts(const std::vector<int64_t>& caps, int64_t layers) {
  const int64_t k = static_cast<int64_t>(caps.size());
  int64_t total = 0;
  for (int64_t c : caps) {
    if (c < 1) return {};
    total += c;
  }
  if (total < layers || k > layers) return {};
  auto held = [&](int64_t most) {
    int64_t n = 0;
    for (int64_t c : caps) n += std::min(c, most);
    return n;
  };
  int64_t most = (layers + k - 1) / k;
  while (held(most) < layers) ++most;
  std::vector<int64_t> counts;
  for (int64_t c : caps) counts.push_back(std::min(c, most));
  int64_t excess = held(most) - layers;
  while (excess > 0) {
    const int64_t largest = *std::max_element(counts.begin(), counts.end());
    for (int64_t& n : counts)
      if (n == largest && excess > 0) --n, --excess;
  }
  return counts;
}

std::string budgets_text(const std::map<int, uint64_t>& budgets, int world_size) {
  std::string s;
  for (int r = 0; r < world_size; ++r) {
    const uint64_t b = budget_of(budgets, r);
    s += str_cat(r == 0 ? "" : ", ", "rank ", r, " ", b == kUnbounded ? std::string("unbounded") : format_bytes(b));
  }
  return s;
}

}  // namespace

const TextSlice* TextSplitPlan::slice_of(int rank) const {
  return rank >= 0 && rank < ranks() ? &slices[static_cast<size_t>(rank)] : nullptr;
}

int TextSplitPlan::rank_of_state(int64_t k) const {
  FLUX_CHECK(k >= 0 && k <= layers, "hidden state ", k, " is not produced by a plan of ", layers, " layers");
  if (k == 0) return 0;
  for (const TextSlice& s : slices)
    if (s.first_layer < k && k <= s.end_layer) return s.rank;
  FLUX_CHECK(false, "no slice produces hidden state ", k);
  return 0;
}

std::string TextSplitPlan::table() const {
  std::string s = "text encoder: ";
  for (const TextSlice& slice : slices) {
    if (slice.rank > 0) s += ", ";
    s += str_cat(slice.rank == 0 ? "layers " : "", range_text(slice.first_layer, slice.end_layer - 1), slice.final_norm ? " + norm" : "",
                 " on rank ", slice.rank, " (", format_bytes(slice.peak_bytes), ")");
  }
  if (split()) s += str_cat("; split over ", ranks(), " ranks while encoding");
  return s;
}

TextSplitPlan plan_text_encoder(const LlmEncoderCosts& llm, int world_size, const std::map<int, uint64_t>& budgets,
                                int64_t dtype_bytes, int64_t text_tokens, uint64_t rank0_job_bytes,
                                int64_t attention_chunk_bytes) {
  FLUX_CHECK(world_size >= 1, "world size ", world_size);
  FLUX_CHECK(llm.layers >= 1 && llm.layers <= llm.shape.num_hidden_layers, "text encoder layers built: ", llm.layers,
             " of ", llm.shape.num_hidden_layers);
  FLUX_CHECK(!llm.final_norm || llm.layers == llm.shape.num_hidden_layers, "the final norm comes after the last layer");
  const SliceCosts costs{llm, dtype_bytes, text_tokens, rank0_job_bytes, attention_chunk_bytes};
  TextSplitPlan plan;
  plan.layers = llm.layers;
  plan.final_norm = llm.final_norm;
  plan.budgets = budgets;

  std::vector<int64_t> last_caps;
  for (int k = 1; k <= world_size && k <= llm.layers; ++k) {
    std::vector<int64_t> caps;
    for (int r = 0; r < k; ++r) caps.push_back(costs.capacity(r, k, budget_of(budgets, r)));
    const std::vector<int64_t> counts = balanced_counts(caps, llm.layers);
    last_caps = caps;
    if (counts.empty()) continue;
    int64_t first = 0;
    for (int r = 0; r < k; ++r) {
      plan.slices.push_back(costs.slice(r, k, first, counts[static_cast<size_t>(r)]));
      first += counts[static_cast<size_t>(r)];
    }
    return plan;
  }

  std::string held;
  for (size_t r = 0; r < last_caps.size(); ++r) held += str_cat(r == 0 ? "" : ", ", last_caps[r]);
  const int k = static_cast<int>(last_caps.size());
  throw UsageError(str_cat(
      "--max-memory: the text encoder does not fit ", k == 1 ? "rank " : "ranks ", range_text(0, k - 1), ": its ", llm.layers, " layers take ",
      format_bytes(costs.layer_bytes()), " each, rank 0 also holds the embeddings (",
      format_bytes(costs.embedding_bytes()), ") and the job's buffers (", format_bytes(rank0_job_bytes),
      "), every rank ", format_bytes(kRuntimeBaselineBytes), " runtime and ", format_bytes(costs.activation_bytes(k > 1)),
      " activations; within the budgets (", budgets_text(budgets, k), ") they hold at most ", held,
      " layers (and a slice needs at least one)"));
}

}  // namespace fluxmpi::parallel
