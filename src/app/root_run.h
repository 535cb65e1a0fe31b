#pragma once
// World rank 0's state between the phases of app/runner.cpp and app/job_loop.cpp, and the stage
// timers of its summary line. Not part of the library's interface.

#include <chrono>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "app/prepare.h"
#include "core/units.h"
#include "pipeline/family.h"

namespace fluxmpi::app {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "1.23 s"
inline std::string seconds_text(double seconds) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << seconds << " s";
  return os.str();
}

struct StageTime {
  std::string name;
  double seconds;
  uint64_t peak_rss;  ///< peak resident memory during the stage
};

// The stage's peak, and a fresh peak for the next stage.
inline uint64_t stage_peak() {
  const uint64_t peak = peak_rss_bytes();
  reset_peak_rss();
  return peak;
}

struct RootRun {
  PreparedRun prepared;
  at::ScalarType dtype = at::kFloat;
  pipeline::PromptEmbeddings prompts;                // per image (fresh ones)
  std::vector<pipeline::EncodedImage> conditioning;  // per image, from the input images
  std::vector<StageTime> times;
};

}  // namespace fluxmpi::app
