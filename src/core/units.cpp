#include "core/units.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"

namespace fluxmpi {

uint64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  std::string number = text.substr(0, pos);
  size_t unit_begin = pos;
  while (unit_begin < text.size() && text[unit_begin] == ' ') ++unit_begin;
  std::string unit;
  for (size_t i = unit_begin; i < text.size(); ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw UsageError(str_cat(what, ": expected a size like 16GiB or 16G, got '", text, "'"));
  }
  // Units in any case. Binary: KiB, MiB, GiB, TiB and Slurm's K, M, G, T (--mem=16G is 16 GiB);
  // decimal: KB, MB, GB, TB.
  const double KiB = 1024.0;
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kib") scale = KiB;
  else if (unit == "m" || unit == "mib") scale = KiB * KiB;
  else if (unit == "g" || unit == "gib") scale = KiB * KiB * KiB;
  else if (unit == "t" || unit == "tib") scale = KiB * KiB * KiB * KiB;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "tb") scale = 1e12;
  else
    throw UsageError(str_cat(what, ": unknown unit '", text.substr(unit_begin), "' in '", text,
                             "' (use B, KiB, MiB, GiB, TiB or K, M, G, T (binary), KB, MB, GB, TB (decimal))"));
  double bytes = value * scale;
  if (!(bytes > 0) || bytes > 1.8e19) throw UsageError(str_cat(what, ": size must be positive, got '", text, "'"));
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) { v /= 1024.0; ++u; }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

namespace {
uint64_t status_field_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) {
      std::istringstream is(line.substr(key.size()));
      uint64_t kib = 0;
      is >> kib;
      return kib * 1024;
    }
  }
  return 0;
}
}  // namespace

uint64_t peak_rss_bytes() { return status_field_kib("VmHWM"); }

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out.flush());
}
uint64_t current_rss_bytes() { return status_field_kib("VmRSS"); }

double process_start_epoch_seconds() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22) {
      std::ifstream boot_in("/proc/stat");
      std::string line;
      while (std::getline(boot_in, line))
        if (line.compare(0, 6, "btime ") == 0) {
          const long ticks = sysconf(_SC_CLK_TCK);
          return ticks > 0 ? std::stod(line.substr(6)) + std::stod(field) / static_cast<double>(ticks) : 0;
        }
    }
  return 0;
}

}  // namespace fluxmpi
