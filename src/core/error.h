#pragma once
/// Error hierarchy of fluxmpi. Every failure a user can cause is one of these, caught once in
/// main, printed as `fluxmpi[rank r/P]: <Kind>: <message>` and mapped to an exit code.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fluxmpi {

/// Process exit codes (documented in docs/reliability.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,   ///< internal error, communication failure, I/O failure while running
  kExitUsage = 2,     ///< bad command line, INI file, prompts file or output path
  kExitBadInput = 3,  ///< bad model files, tokenizer files, checkpoint or input image
};

/// Concatenates anything streamable into one string: str_cat("got ", 3, " of ", n).
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  /// Short class name printed before the message, e.g. "ConfigError".
  virtual const char* kind() const noexcept { return "Error"; }
  virtual int exit_code() const noexcept { return kExitFailure; }
};

#define FLUXMPI_DEFINE_ERROR(Name, code)                                  \
  class Name : public Error {                                             \
   public:                                                                \
    explicit Name(const std::string& message) : Error(message) {}         \
    const char* kind() const noexcept override { return #Name; }          \
    int exit_code() const noexcept override { return code; }              \
  };

/// Command line, INI file, prompts file, output paths.
FLUXMPI_DEFINE_ERROR(UsageError, kExitUsage)
/// config.json / model_index.json content, or configs that disagree.
FLUXMPI_DEFINE_ERROR(ConfigError, kExitBadInput)
/// safetensors files: malformed, missing tensors, wrong shapes.
FLUXMPI_DEFINE_ERROR(WeightError, kExitBadInput)
/// tokenizer files (vocab, merges, spiece.model).
FLUXMPI_DEFINE_ERROR(TokenizerError, kExitBadInput)
/// HDF5 checkpoints given to --resume or fluxmpi-inspect.
FLUXMPI_DEFINE_ERROR(CheckpointError, kExitBadInput)
/// Input images and masks (--image, --mask, --control-image): undecodable, truncated, too large.
FLUXMPI_DEFINE_ERROR(ImageError, kExitBadInput)
/// Messages between ranks that do not match what the receiver expects.
FLUXMPI_DEFINE_ERROR(CommError, kExitFailure)
/// Reading or writing files while running (disk full, permissions changed, ...).
FLUXMPI_DEFINE_ERROR(IoError, kExitFailure)
/// A broken invariant of fluxmpi itself.
FLUXMPI_DEFINE_ERROR(InternalError, kExitFailure)

#undef FLUXMPI_DEFINE_ERROR

}  // namespace fluxmpi

/// FLUX_CHECK(cond, "message ", value): throws InternalError with the message when cond is false.
#define FLUX_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      throw ::fluxmpi::InternalError(::fluxmpi::str_cat("check failed: " #cond ": ", ##__VA_ARGS__)); \
    }                                                                                      \
  } while (0)

/// FLUX_CHECK_AS(ErrorType, cond, "message ", value): throws ErrorType (e.g. WeightError).
#define FLUX_CHECK_AS(ErrorType, cond, ...)                                   \
  do {                                                                        \
    if (!(cond)) {                                                            \
      throw ::fluxmpi::ErrorType(::fluxmpi::str_cat(__VA_ARGS__));            \
    }                                                                         \
  } while (0)
