#pragma once
// fluxmpi-inspect: what a checkpoint holds, per-step latent statistics, previews and decodes of any
// stored step, comparison of two runs, and following a running job. main.cpp parses the command
// line into InspectOptions; everything else is here and in latents_view / diff.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "latents_view.h"

namespace fluxmpi::inspect {

// Exit codes: 0 ok; 1 --diff above tolerance or --follow timed out; 2 usage error; 3 the file is
// not a (valid) fluxmpi checkpoint or the model is bad (errors carry their own exit code).
inline constexpr int kExitDifferent = 1;

struct InspectOptions {
  std::string file;
  std::optional<int64_t> image;  // --image I
  std::optional<int64_t> step;  // --step K (-1: initial noise)
  bool stats = false;  // --stats
  std::string preview;  // --preview PNG
  std::string decode;  // --decode PNG
  std::string model;  // --model DIR (for --decode)
  std::optional<std::string> latent;  // --latent x0|noisy (default x0)
  std::string diff;  // --diff OTHER.h5
  std::optional<double> tol;  // --tol T (default 0: identical)
  bool follow = false;  // --follow
  std::optional<double> timeout;  // --timeout S for --follow (default: none)
  std::optional<double> interval;  // --interval S for --follow (default 1)
};

// Runs one invocation and returns its exit code. Bad options throw UsageError; a bad checkpoint
// throws CheckpointError.
int run_inspect(const InspectOptions& options, std::ostream& out);

// "a photo of a cat" cut to at most `max_chars` UTF-8 characters, "…" marking a cut.
std::string shorten(const std::string& text, size_t max_chars);

}  // namespace fluxmpi::inspect
