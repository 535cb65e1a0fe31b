// The planner's options (--balance, --max-memory, --partition) and the text helpers of plan_text.h.
#include "parallel/plan_text.h"

#include <cctype>
#include <sstream>

#include "core/error.h"
#include "core/units.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel {

namespace detail {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(trim(item));
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

std::optional<int64_t> parse_index(const std::string& s) {
  if (s.empty() || s.size() > 12) return std::nullopt;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  return std::stoll(s);
}

std::string range_text(int64_t first, int64_t last) {
  return first == last ? std::to_string(first) : str_cat(first, "-", last);
}

}  // namespace detail

using detail::parse_index;
using detail::range_text;
using detail::split;
using detail::trim;

Balance parse_balance(const std::string& text) {
  if (text == "compute") return Balance::Compute;
  if (text == "memory") return Balance::Memory;
  throw UsageError(str_cat("--balance must be 'compute' or 'memory', got '", text, "'"));
}

std::map<int, uint64_t> parse_max_memory(const std::string& text, int world_size) {
  std::map<int, uint64_t> budgets;
  std::optional<uint64_t> every;
  if (trim(text).empty()) return budgets;
  for (const std::string& entry : split(text, ',')) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      // "16GiB": the budget of every rank not named.
      if (every)
        throw UsageError(str_cat("--max-memory: more than one budget without a rank in '", text,
                                 "' (one value for every rank, e.g. 16GiB, or entries like 0=16GiB,1=24GiB)"));
      if (entry.empty())
        throw UsageError(str_cat("--max-memory: expected 16GiB (every rank) or entries like 0=16GiB,1=24GiB, got '", text, "'"));
      every = parse_bytes(entry, "--max-memory");
      continue;
    }
    const std::string rank_text = trim(entry.substr(0, eq));
    const auto rank = parse_index(rank_text);
    if (!rank) throw UsageError(str_cat("--max-memory: '", rank_text, "' is not a rank number (in '", text, "')"));
    if (*rank >= world_size)
      throw UsageError(str_cat("--max-memory: rank ", *rank, " is out of range: the job has ", world_size,
                               " rank", world_size == 1 ? "" : "s", " (0-", world_size - 1, ")"));
    if (budgets.count(static_cast<int>(*rank)))
      throw UsageError(str_cat("--max-memory: rank ", *rank, " is given twice in '", text, "'"));
    budgets[static_cast<int>(*rank)] = parse_bytes(trim(entry.substr(eq + 1)), str_cat("--max-memory for rank ", *rank));
  }
  if (every)
    for (int r = 0; r < world_size; ++r) budgets.emplace(r, *every);
  return budgets;
}

std::vector<BlockRange> parse_partition(const std::string& text, int world_size, int64_t num_blocks) {
  std::vector<std::optional<BlockRange>> by_rank(world_size);
  const std::string example = "expected entries like 0:0-8,1:9-56 (rank:first-last)";
  for (const std::string& entry : split(text, ',')) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) throw UsageError(str_cat("--partition: ", example, ", got '", entry, "' in '", text, "'"));
    const auto rank = parse_index(trim(entry.substr(0, colon)));
    const std::string range = trim(entry.substr(colon + 1));
    const size_t dash = range.find('-');
    const auto first = parse_index(trim(range.substr(0, dash)));
    const auto last = dash == std::string::npos ? first : parse_index(trim(range.substr(dash + 1)));
    if (!rank || !first || !last) throw UsageError(str_cat("--partition: ", example, ", got '", entry, "' in '", text, "'"));
    if (*rank >= world_size)
      throw UsageError(str_cat("--partition: rank ", *rank, " is out of range: the job has ", world_size, " rank",
                               world_size == 1 ? "" : "s", " (0-", world_size - 1, ")"));
    if (by_rank[*rank]) throw UsageError(str_cat("--partition: rank ", *rank, " is given twice in '", text, "'"));
    by_rank[*rank] = BlockRange{*first, *last};
  }
  std::vector<BlockRange> ranges;
  for (int r = 0; r < world_size; ++r) {
    if (!by_rank[r])
      throw UsageError(str_cat("--partition: rank ", r, " has no blocks; every rank 0-", world_size - 1,
                               " needs a slice of the ", num_blocks, " blocks"));
    ranges.push_back(*by_rank[r]);
  }
  check_partition(ranges, world_size, num_blocks);
  return ranges;
}

void check_partition(const std::vector<BlockRange>& ranges, int world_size, int64_t num_blocks) {
  if (static_cast<int>(ranges.size()) != world_size)
    throw UsageError(str_cat("--partition: gives slices to ", ranges.size(), " ranks, the job has ", world_size));
  for (int r = 0; r < world_size; ++r) {
    const BlockRange& b = ranges[r];
    if (b.first > b.last)
      throw UsageError(str_cat("--partition: rank ", r, " has the empty range ", b.first, "-", b.last, " (first > last)"));
    if (b.last >= num_blocks)
      throw UsageError(str_cat("--partition: block ", b.last, " of rank ", r, " is out of range: the transformer has ",
                               num_blocks, " blocks (0-", num_blocks - 1, ")"));
  }
  // Overlaps and gaps are judged over all slices by position, then the order of the ranks.
  std::vector<int> order(world_size);
  for (int r = 0; r < world_size; ++r) order[r] = r;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return ranges[a].first < ranges[b].first; });
  int64_t next = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const BlockRange& b = ranges[order[k]];
    if (b.first < next)
      throw UsageError(str_cat("--partition: blocks ", range_text(b.first, std::min(b.last, next - 1)),
                               " are given to both rank ", order[k - 1], " and rank ", order[k]));
    if (b.first > next) throw UsageError(str_cat("--partition: blocks ", range_text(next, b.first - 1), " are given to no rank"));
    next = b.last + 1;
  }
  if (next < num_blocks) throw UsageError(str_cat("--partition: blocks ", range_text(next, num_blocks - 1), " are given to no rank"));
  for (int r = 1; r < world_size; ++r) {
    if (ranges[r].first < ranges[r - 1].first)
      throw UsageError(str_cat("--partition: slices must follow rank order, but rank ", r, " has blocks ",
                               range_text(ranges[r].first, ranges[r].last), " before rank ", r - 1, "'s ",
                               range_text(ranges[r - 1].first, ranges[r - 1].last)));
  }
}

}  // namespace fluxmpi::parallel
