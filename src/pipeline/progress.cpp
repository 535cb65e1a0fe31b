#include "pipeline/progress.h"

#include <unistd.h>

#include <cstdio>

#include "core/log.h"

namespace fluxmpi::pipeline {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                               static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

Progress::Progress(int64_t total, bool enabled)
    : total_(total), enabled_(enabled && total > 0), tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()), last_print_(start_) {}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::advance(int64_t done, const std::string& what) {
  done_ += done;
  print(what, done_ == done || done_ >= total_);
}

void Progress::print(const std::string& what, bool force) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  const double since_last = std::chrono::duration<double>(now - last_print_).count();
  if (!force && since_last < (tty_ ? 0.1 : 5.0)) return;
  last_print_ = now;
  const double elapsed = elapsed_seconds();
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : -1;
  const int pct = static_cast<int>(100.0 * static_cast<double>(done_) / static_cast<double>(total_));
  char line[256];
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * static_cast<double>(done_) / static_cast<double>(total_));
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::snprintf(line, sizeof line, "\r[%s] %3d%% %lld/%lld steps, %.2f steps/s, ETA %s  ", bar.c_str(), pct,
                  static_cast<long long>(done_), static_cast<long long>(total_), rate, format_duration(eta).c_str());
    std::fputs(line, stderr);
    std::fflush(stderr);
  } else {
    std::snprintf(line, sizeof line, "progress: %lld/%lld steps (%d%%), %.2f steps/s, elapsed %s, ETA %s, %s",
                  static_cast<long long>(done_), static_cast<long long>(total_), pct, rate,
                  format_duration(elapsed).c_str(), format_duration(eta).c_str(), what.c_str());
    log::info(line);
  }
}

void Progress::finish() {
  if (enabled_ && tty_) std::fputs("\n", stderr);
}

}  // namespace fluxmpi::pipeline
