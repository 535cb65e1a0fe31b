#pragma once
/// Progress of the denoising loop on rank 0: a bar with steps/s and ETA redrawn in place on a
/// terminal; plain one-line records when stderr is not a terminal (batch logs), at most one every
/// few seconds plus the first and the last.

#include <chrono>
#include <cstdint>
#include <string>

namespace fluxmpi::pipeline {

class Progress {
 public:
  /// `total` image-steps to run; `enabled` false prints nothing (--no-progress).
  Progress(int64_t total, bool enabled);
  /// `done` more image-steps finished; `what` describes the latest ("image 3, step 12/28").
  void advance(int64_t done, const std::string& what);
  /// Ends the bar's line on a terminal.
  void finish();
  double elapsed_seconds() const;

 private:
  void print(const std::string& what, bool force);
  int64_t total_, done_ = 0;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point start_, last_print_;
};

/// "1:02:03" / "4:05"
std::string format_duration(double seconds);

}  // namespace fluxmpi::pipeline
