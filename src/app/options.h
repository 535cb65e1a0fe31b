#pragma once
/// The `fluxmpi` options: one table (Boost.Program_options, groups model, sampling, parallel,
/// output, general) that parses the command line and the `--config` INI file, generates `--help`,
/// and fills one validated RunConfig. Nothing else in fluxmpi reads argv.
///
/// Every problem is a UsageError (exit code 2) naming the option, its value and, for values from
/// the INI file, the file: `--steps must be an integer, got 'abc' (set in config file 'run.ini')`.

#include <string>
#include <vector>

#include "pipeline/run_config.h"

namespace fluxmpi::app {

using pipeline::RunConfig;

struct ParseResult {
  enum class Action { Run, Help, Version };
  Action action = Action::Run;
  RunConfig config;  ///< valid when action == Run
  std::string text;  ///< what to print (to stdout) for Help and Version
};

/// Parses and validates argv (argv[0] is the program name). With --help or --version nothing else
/// is validated. Reads the INI file and the prompts file; checks that --model, --resume and the
/// output and checkpoint directories exist and that a new --checkpoint does not. Logs the warnings
/// of option combinations that do nothing (a negative prompt without --true-cfg > 1 and vice versa).
ParseResult parse_options(int argc, const char* const* argv);
/// The same without a program name: parse_options({"--model", "m", "--prompt", "a cat"}).
ParseResult parse_options(const std::vector<std::string>& args);

/// The --help text: usage, every option by group with its default, exit codes.
std::string help_text();
/// `fluxmpi <version> (libtorch <version>)`.
std::string version_text();

}  // namespace fluxmpi::app
