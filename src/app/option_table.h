#pragma once
// The one table of fluxmpi's options (app/options.h): each option's long name (also its INI key),
// group, kind, default and help. --help, the command line and the INI file are all read with the
// Boost tables made from it. Internal to the options: not part of the library's interface.

#include <boost/program_options.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace fluxmpi::app::options {

enum class Kind { Flag, Text, Integer, Number };
enum class Group { Model, Sampling, Images, Parallel, Output, General };

// One option: its long name is also its INI key.
struct Spec {
  const char* name;
  char short_name;
  Group group;
  Kind kind;
  const char* value_name;  // shown in --help
  const char* fallback;    // default when absent (shown in --help); nullptr = none or model-dependent
  const char* help;
  bool cli_only;           // --config, --help, --version: not INI keys
  bool repeatable = false; // --lora: every occurrence counts (the command line's replace the INI file's)
};

// A side of 65536 pixels is already 16.7M image tokens, far beyond what attention over them can
// hold; the bound keeps the size arithmetic (tokens, bytes) far from overflow.
inline constexpr int64_t kMaxImageSide = 65536;
// diffusers refuses longer T5 sequences for FLUX (the model was trained with at most 512).
inline constexpr int64_t kMaxSequenceLength = 512;
// Bounds that keep a typo from allocating terabytes or spawning a million threads: 10000 steps
// is far beyond any FLUX schedule in use (diffusers trains on 1000 timesteps); 1024 threads is
// more than the cores of any node a rank runs on.
inline constexpr int64_t kMaxSteps = 10000;
inline constexpr int64_t kMaxThreads = 1024;
inline constexpr int64_t kMaxRanks = 1 << 24;
inline constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

/// Every option, in --help order.
const std::vector<Spec>& all_specs();
/// The option named `name` (long name); null for none.
const Spec* find_spec(const std::string& name);
/// The Boost table of every group: on the command line flags take no value; in the INI file
/// (`for_ini`) every key takes one (flags "true"/"false") and the command-line-only options are left out.
boost::program_options::options_description full_table(bool for_ini);

}  // namespace fluxmpi::app::options
