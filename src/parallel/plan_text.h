#pragma once
// Text helpers shared by the planner's option parsers (plan_options.cpp) and its messages
// (partition.cpp, plan_advice.cpp). Internal to src/parallel.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fluxmpi::parallel::detail {

std::string trim(const std::string& s);
/// Splits at `sep`, trimming each item; a trailing separator gives a last empty item.
std::vector<std::string> split(const std::string& s, char sep);
/// A non-negative decimal integer, or nullopt.
std::optional<int64_t> parse_index(const std::string& s);
/// "7" or "3-9".
std::string range_text(int64_t first, int64_t last);

}  // namespace fluxmpi::parallel::detail
