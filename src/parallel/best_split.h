#pragma once
// The planner's search: the best contiguous split of the blocks over the ranks under a
// lexicographic cost (partition.cpp). Internal to src/parallel.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace fluxmpi::parallel::detail {

// A split's cost, compared lexicographically: for each level in turn, the per-rank values sorted
// from the largest down (the largest peak, then the next largest, ...). Adding the same slice to
// two partial splits keeps their order, so the best split of the first r ranks over the first j
// blocks extends to the best split of all: a dynamic programme over (ranks used, blocks covered).
using SplitKey = std::vector<std::vector<int64_t>>;

inline SplitKey extended(const SplitKey& key, const std::vector<int64_t>& slice) {
  SplitKey out = key;
  out.resize(slice.size());
  for (size_t level = 0; level < slice.size(); ++level) {
    auto& values = out[level];
    values.insert(std::upper_bound(values.begin(), values.end(), slice[level], std::greater<int64_t>()), slice[level]);
  }
  return out;
}

// Contiguous split of B blocks into P non-empty slices with the lexicographically smallest
// SplitKey of `cost(rank, first, last)` (one value per level), slices that break a budget
// excluded. O(P B^2) slice costs. Ties go to the earliest cut. Returns the first block of each
// rank, or an empty vector when nothing fits.
template <typename Cost, typename Feasible>
std::vector<int64_t> best_split(int P, int64_t B, Cost cost, Feasible feasible) {
  std::vector<std::vector<std::optional<SplitKey>>> best(P + 1, std::vector<std::optional<SplitKey>>(B + 1));
  std::vector<std::vector<int64_t>> choice(P + 1, std::vector<int64_t>(B + 1, -1));
  best[0][0] = SplitKey{};
  for (int r = 1; r <= P; ++r) {
    // Rank r-1 takes blocks [i, j); the ranks before it need one block each, the ranks after it
    // one block each too.
    for (int64_t j = r; j <= B - (P - r); ++j) {
      for (int64_t i = r - 1; i < j; ++i) {
        if (!best[r - 1][i] || !feasible(r - 1, i, j - 1)) continue;
        SplitKey key = extended(*best[r - 1][i], cost(r - 1, i, j - 1));
        if (!best[r][j] || key < *best[r][j]) {
          best[r][j] = std::move(key);
          choice[r][j] = i;
        }
      }
    }
  }
  if (!best[P][B]) return {};
  std::vector<int64_t> firsts(P);
  int64_t j = B;
  for (int r = P; r >= 1; --r) {
    firsts[r - 1] = choice[r][j];
    j = choice[r][j];
  }
  return firsts;
}
}  // namespace fluxmpi::parallel::detail
